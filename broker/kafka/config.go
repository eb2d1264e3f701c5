package kafka

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Client defaults.
const (
	// DialTimeoutDefault bounds establishing a connection to a broker.
	DialTimeoutDefault = 10 * time.Second
	// TopicPrefixDefault is the prefix of the topics events are routed to,
	// as Debezium's Outbox Event Router names them: outbox.event.<aggregate_type>.
	TopicPrefixDefault = "outbox.event."
)

// ClientConfig says how to reach Kafka. It is embedded in PublisherConfig and
// SubscriberConfig.
type ClientConfig struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// ClientID is the client id brokers log and use for quotas. Defaults to
	// "idem".
	ClientID string
	// TLS, when set, connects with TLS.
	TLS *tls.Config
	// DialTimeout bounds establishing a connection. Defaults to 10s.
	DialTimeout time.Duration
	// Logger receives warnings and errors. Defaults to slog.Default().
	Logger *slog.Logger
	// Opts are further franz-go options (SASL, timeouts, ...), applied after
	// idem's own. Options that change delivery guarantees (acks, idempotence,
	// auto-commit) are overridden by idem's where they matter.
	Opts []kgo.Opt
}

func (c ClientConfig) withDefaults() ClientConfig {
	if c.ClientID == "" {
		c.ClientID = "idem"
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DialTimeoutDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c ClientConfig) validate(prefix string) error {
	if len(c.Brokers) == 0 {
		return fmt.Errorf("idem: kafka: %s.Brokers is required (host:port of at least one broker)", prefix)
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			return fmt.Errorf("idem: kafka: %s.Brokers has an empty entry", prefix)
		}
	}
	if c.DialTimeout < 0 {
		return fmt.Errorf("idem: kafka: %s.DialTimeout %v is negative", prefix, c.DialTimeout)
	}
	return nil
}

// opts returns the franz-go options common to producers and consumers.
func (c ClientConfig) opts() []kgo.Opt {
	o := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(c.ClientID),
		kgo.DialTimeout(c.DialTimeout),
		// Idempotent producer with acks=all: a record is confirmed only
		// once every in-sync replica has it, and retries never duplicate or
		// reorder records within a partition.
		kgo.RequiredAcks(kgo.AllISRAcks()),
	}
	if c.TLS != nil {
		o = append(o, kgo.DialTLSConfig(c.TLS))
	}
	return o
}

// ErrClosed is returned by a Publisher used after Close, and by a Subscriber
// started after Stop.
var ErrClosed = errors.New("idem: kafka: closed")

// validTopic reports whether name is a legal Kafka topic name.
func validTopic(name string) bool {
	if name == "" || len(name) > 249 || name == "." || name == ".." {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
