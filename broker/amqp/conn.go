package amqp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
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
	//
	// For a cluster, list its nodes in the host part, separated by commas:
	// amqp://user:pass@h1:5672,h2:5672,h3:5672/vhost. Every host shares the
	// URL's credentials, vhost and query parameters; a host without a port
	// takes the scheme's (5672 for amqp, 5671 for amqps). A connection goes
	// to the first host that answers, starting with the first one listed;
	// after a connection is lost, the next attempt starts with the host after
	// the one that was lost, round robin, so that a dead or frozen node is
	// tried last.
	URL string
	// Username and Password, when set, replace the credentials of URL, so that
	// they can come from the environment or a secret store rather than the URL.
	Username string
	Password string
	// TLS configures amqps:// connections. Nil uses the system roots and the
	// URL's cacertfile, certfile and keyfile parameters (see ParseURL),
	// read at each connection.
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

	// hosts is where the next connection attempt starts, shared by the
	// copies of a defaulted configuration (set by withDefaults).
	hosts *hostRing
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
	if c.hosts == nil {
		c.hosts = new(hostRing)
	}
	return c
}

func (c ConnConfig) validate(prefix string) error {
	if c.URL == "" {
		return fmt.Errorf("idem: amqp: %s.URL is required (amqp://user:pass@host:5672/)", prefix)
	}
	urls, err := SplitURL(c.URL)
	if err != nil {
		return fmt.Errorf("idem: amqp: %s.URL: %w", prefix, err)
	}
	if c.TLS == nil {
		// The hosts share the query: the first one's is everyone's.
		if u, err := url.Parse(urls[0]); err == nil {
			if err := checkTLSFiles(u); err != nil {
				return fmt.Errorf("idem: amqp: %s.URL %s: %w", prefix, c.redacted(), err)
			}
		}
	}
	if c.ReconnectMin < 0 || c.ReconnectMax < c.ReconnectMin {
		return fmt.Errorf("idem: amqp: %s.ReconnectMin %v and ReconnectMax %v: want 0 <= min <= max", prefix, c.ReconnectMin, c.ReconnectMax)
	}
	return nil
}

// redacted returns the URL without its password.
func (c ConnConfig) redacted() string { return broker.RedactURL(c.URL) }

// dial opens a connection to one of the URL's hosts (see ConnConfig.URL):
// it tries each in turn, starting after the host of the previous
// connection, and fails only when none answers.
func (c ConnConfig) dial(ctx context.Context) (*amqp091.Connection, error) {
	urls, err := SplitURL(c.URL)
	if err != nil {
		return nil, err
	}
	ring := c.hosts
	if ring == nil {
		ring = new(hostRing)
	}
	start := ring.start(len(urls))
	var errs []error
	for i := range urls {
		k := (start + i) % len(urls)
		conn, err := c.dialHost(ctx, urls[k])
		if err == nil {
			if prev := ring.connected(k); len(urls) > 1 && prev != k {
				c.Logger.Info("amqp: connected to a cluster node", "host", hostOf(urls[k]), "url", c.redacted())
			}
			return conn, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 1 {
		return nil, errs[0]
	}
	return nil, fmt.Errorf("idem: amqp: no host of %s answered: %w", c.redacted(), errors.Join(errs...))
}

// dialHost opens a connection to rawURL, one host of the URL.
func (c ConnConfig) dialHost(ctx context.Context, rawURL string) (*amqp091.Connection, error) {
	props := amqp091.NewConnectionProperties()
	if c.ConnectionName != "" {
		props.SetClientConnectionName(c.ConnectionName)
	}
	// interrupt ends the handshake when ctx ends during it (a Stop
	// during Start); unhook removes it once the handshake is over.
	var unhook func() bool
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
			unhook = context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
			return conn, nil
		},
	}
	if c.Username != "" || c.Password != "" {
		cfg.SASL = []amqp091.Authentication{&amqp091.PlainAuth{Username: c.Username, Password: c.Password}}
	}
	if c.TLS != nil {
		cfg.TLSClientConfig = c.TLS.Clone()
	}
	conn, err := amqp091.DialConfig(rawURL, cfg)
	if unhook != nil && !unhook() {
		// ctx ended during the handshake, which failed (or may be broken).
		if err == nil {
			_ = conn.Close()
		}
		err = context.Cause(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("idem: amqp: connect to %s: %w", broker.RedactURL(rawURL), redactErr(err, rawURL))
	}
	return conn, nil
}

// hostRing remembers the host of the last connection of a multi-host URL,
// so that the next attempt starts with the host after it.
type hostRing struct {
	// last is the index of the last host connected to, plus one (0: none
	// yet).
	last atomic.Int64
}

// start returns the index of the host to try first among n.
func (r *hostRing) start(n int) int {
	last := int(r.last.Load())
	if last == 0 {
		return 0
	}
	return last % n // the host after last-1
}

// connected records a connection to host k and returns the previous one
// (-1 when none).
func (r *hostRing) connected(k int) int {
	return int(r.last.Swap(int64(k)+1)) - 1
}

// SplitURL returns one URL per host of a RabbitMQ URL that lists several,
// amqp://user:pass@h1:5672,h2:5672/vhost (see ConnConfig.URL), each with the
// URL's credentials, vhost and query; a URL with one host is returned as is.
// It checks that each is an amqp:// or amqps:// URL with a host. Errors never
// contain the password.
func SplitURL(rawURL string) ([]string, error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, fmt.Errorf("%s: not a URL: want amqp://user:pass@host:5672/vhost", broker.RedactURL(rawURL))
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	userinfo, hostList := "", authority
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		userinfo, hostList = authority[:at+1], authority[at+1:]
	}
	hosts := strings.Split(hostList, ",")
	urls := make([]string, 0, len(hosts))
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			return nil, fmt.Errorf("%s: empty host in the host list (want host:port,host:port)", broker.RedactURL(rawURL))
		}
		one := scheme + "://" + userinfo + h + tail
		u, err := url.Parse(one)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // without the URL and its password
			}
			return nil, fmt.Errorf("%s: host %q: %w", broker.RedactURL(rawURL), h, err)
		}
		if s := strings.ToLower(u.Scheme); s != "amqp" && s != "amqps" {
			return nil, fmt.Errorf("%s: scheme %q: want amqp or amqps", broker.RedactURL(rawURL), u.Scheme)
		}
		if u.Hostname() == "" {
			return nil, fmt.Errorf("%s: no host (want amqp://user:pass@host:5672/vhost)", broker.RedactURL(rawURL))
		}
		urls = append(urls, one)
	}
	if len(urls) == 1 {
		return []string{rawURL}, nil
	}
	return urls, nil
}

// hostOf returns the host:port of a one-host URL, for logs.
func hostOf(rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil {
		return u.Host
	}
	return ""
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

// describeClose turns an AMQP close reason into an error that says whether the
// channel or the whole connection was closed, and why.
func describeClose(what string, e *amqp091.Error) error {
	if e == nil {
		return fmt.Errorf("idem: amqp: %s closed", what)
	}
	return fmt.Errorf("idem: amqp: %s closed by the broker: %w", what, e)
}
