// Package brokeropen opens a broker publisher from a URL for the idem and shop
// commands. Each transport adds its scheme here.
package brokeropen

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/idem-go/idem/broker"
)

// Publisher is a publisher that must be closed.
type Publisher interface {
	broker.Publisher
	Close() error
}

// Open returns a publisher for rawURL.
func Open(ctx context.Context, rawURL string) (Publisher, error) {
	if rawURL == "" {
		return nil, errors.New("no broker URL: pass --broker or set IDEM_BROKER_URL (for example amqp://guest:guest@localhost:5672/)")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("broker URL %s: %w", broker.RedactURL(rawURL), err)
	}
	switch strings.ToLower(u.Scheme) {
	// Transports add their case here.
	default:
		return nil, fmt.Errorf("broker URL %s: scheme %q is not supported", broker.RedactURL(rawURL), u.Scheme)
	}
}
