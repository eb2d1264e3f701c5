package amqp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/broker"
)

// Connection defaults.
const (
	// ExchangeDefault is the topic exchange events are published to.
	ExchangeDefault = "events"
	// HeartbeatDefault is the AMQP heartbeat interval.
	HeartbeatDefault = 10 * time.Second
	// DialTimeoutDefault bounds the TCP, TLS and AMQP handshakes.
	DialTimeoutDefault = 30 * time.Second
	// ReconnectMinDefault is the first delay before reconnecting.
	ReconnectMinDefault = 100 * time.Millisecond
	// ReconnectMaxDefault caps the delay between reconnection attempts, so
	// that a subscriber or a publisher is back within a few seconds of the
	// broker's return. An attempt against a broker that is down costs one
	// refused connection.
	ReconnectMaxDefault = 2 * time.Second
)

// HeaderKey is the header carrying idem.Message.Key (the aggregate id) on
// RabbitMQ, which has no message key of its own. The subscriber moves it back
// to Message.Key and uses it to keep the messages of one aggregate on one
// worker.
const HeaderKey = "idem-key"

// ConnConfig says how to reach RabbitMQ. It is embedded in PublisherConfig and
// SubscriberConfig.
type ConnConfig struct {
	// URL is the broker URL, amqp://user:pass@host:5672/vhost or amqps:// for
	// TLS. The password never appears in logs or errors. Required.
	URL string
	// Username and Password, when set, replace the credentials of URL, so that
	// they can come from the environment or a secret store rather than the URL.
	Username string
	Password string
	// TLS configures amqps:// connections. Nil uses the system roots and the
	// URL's certfile, keyfile and cacertfile parameters.
	TLS *tls.Config
	// Heartbeat is the AMQP heartbeat interval. Defaults to 10s.
	Heartbeat time.Duration
	// DialTimeout bounds establishing a connection. Defaults to 30s.
	DialTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the exponential, jittered delay
	// between reconnection attempts after the connection is lost. Default to
	// 100ms and 2s.
	ReconnectMin time.Duration
	ReconnectMax time.Duration
	// ConnectionName is shown by rabbitmqctl list_connections and the
	// management UI.
	ConnectionName string
	// Logger receives connection events and warnings. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

func (c ConnConfig) withDefaults() ConnConfig {
	if c.Heartbeat == 0 {
		c.Heartbeat = HeartbeatDefault
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DialTimeoutDefault
	}
	if c.ReconnectMin == 0 {
		c.ReconnectMin = ReconnectMinDefault
	}
	if c.ReconnectMax == 0 {
		c.ReconnectMax = ReconnectMaxDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c ConnConfig) validate(prefix string) error {
	if c.URL == "" {
		return fmt.Errorf("idem: amqp: %s.URL is required (amqp://user:pass@host:5672/)", prefix)
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return fmt.Errorf("idem: amqp: %s.URL %s: %w", prefix, broker.RedactURL(c.URL), redactErr(err, c.URL))
	}
	if s := strings.ToLower(u.Scheme); s != "amqp" && s != "amqps" {
		return fmt.Errorf("idem: amqp: %s.URL %s: scheme %q: want amqp or amqps", prefix, broker.RedactURL(c.URL), u.Scheme)
	}
	if c.ReconnectMin < 0 || c.ReconnectMax < c.ReconnectMin {
		return fmt.Errorf("idem: amqp: %s.ReconnectMin %v and ReconnectMax %v: want 0 <= min <= max", prefix, c.ReconnectMin, c.ReconnectMax)
	}
	return nil
}

// redacted returns the URL without its password.
func (c ConnConfig) redacted() string { return broker.RedactURL(c.URL) }

// dial opens a connection.
func (c ConnConfig) dial(ctx context.Context) (*amqp091.Connection, error) {
	props := amqp091.NewConnectionProperties()
	if c.ConnectionName != "" {
		props.SetClientConnectionName(c.ConnectionName)
	}
	cfg := amqp091.Config{
		Heartbeat:       c.Heartbeat,
		TLSClientConfig: c.TLS,
		Properties:      props,
		Locale:          "en_US",
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: c.DialTimeout}
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bounds the AMQP handshake; amqp091 clears it afterwards.
			if err := conn.SetDeadline(time.Now().Add(c.DialTimeout)); err != nil {
				_ = conn.Close()
				return nil, err
			}
			return conn, nil
		},
	}
	if c.Username != "" || c.Password != "" {
		cfg.SASL = []amqp091.Authentication{&amqp091.PlainAuth{Username: c.Username, Password: c.Password}}
	}
	if c.TLS != nil {
		cfg.TLSClientConfig = c.TLS.Clone()
	}
	conn, err := amqp091.DialConfig(c.URL, cfg)
	if err != nil {
		return nil, fmt.Errorf("idem: amqp: connect to %s: %w", c.redacted(), redactErr(err, c.URL))
	}
	return conn, nil
}

// redactErr makes sure an error text does not carry the URL's password.
func redactErr(err error, rawURL string) error {
	if err == nil {
		return nil
	}
	u, perr := url.Parse(rawURL)
	if perr != nil || u.User == nil {
		return err
	}
	pass, ok := u.User.Password()
	if !ok || pass == "" || !strings.Contains(err.Error(), pass) {
		return err
	}
	return errors.New(strings.ReplaceAll(err.Error(), pass, "xxxxx"))
}

// backoff is an exponential, jittered reconnection delay.
type backoff struct {
	min, max time.Duration
	cur      time.Duration
}

// next returns the delay before the next attempt and doubles it.
func (b *backoff) next() time.Duration {
	if b.cur < b.min {
		b.cur = b.min
	}
	d := b.cur
	b.cur = min(2*b.cur, b.max)
	// Full jitter in [d/2, d).
	if d > 1 {
		d = d/2 + rand.N(d/2)
	}
	return d
}

func (b *backoff) reset() { b.cur = 0 }

// describeClose turns an AMQP close reason into an error that says whether the
// channel or the whole connection was closed, and why.
func describeClose(what string, e *amqp091.Error) error {
	if e == nil {
		return fmt.Errorf("idem: amqp: %s closed", what)
	}
	return fmt.Errorf("idem: amqp: %s closed by the broker: %w", what, e)
}
