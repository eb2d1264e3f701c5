package kafka

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/tlsfiles"
)

// URLConfig is what a Kafka URL says (ParseURL): how to reach the cluster,
// and the topics' prefix. PublisherConfig and SubscriberConfig turn it into
// the configuration of a publisher or a subscriber.
type URLConfig struct {
	// ClientConfig has the brokers, the parameter client_id, the TLS
	// configuration of the parameters tls, tls_ca, tls_cert and tls_key,
	// and in Opts the session timeout (kgo.SessionTimeout) and the SASL
	// mechanism (kgo.SASL) of the parameters session_timeout and sasl.
	ClientConfig
	// TopicPrefix is the parameter topic_prefix: what comes before the
	// aggregate type in the topic names. Empty when absent
	// (TopicPrefixDefault).
	TopicPrefix string
	// CloudEvents is set by the parameters cloudevents and
	// cloudevents_source (broker.CloudEventsFromURL): a publisher produces
	// CloudEvents. nil when absent.
	CloudEvents *idem.CloudEvents
}

// urlParams are the parameters of a Kafka URL.
var urlParams = []string{"topic_prefix", "client_id", "session_timeout", "tls", "tls_ca", "tls_cert", "tls_key", "sasl", "sasl_user", "sasl_password",
	"cloudevents", "cloudevents_source"}

// ParseURL parses a Kafka URL, kafka://host:9092[,host2:9092][?params].
// Its parameters:
//
//   - topic_prefix replaces "outbox.event." in the topic names
//     (<prefix><aggregate_type>);
//   - client_id sets the client id;
//   - session_timeout sets the consumer group session timeout (how long a
//     dead consumer keeps its partitions; Kafka's default is 45s);
//   - tls=true connects with TLS (system roots), tls_ca=FILE trusts FILE's
//     certificates instead, tls_cert=FILE and tls_key=FILE present a client
//     certificate (any of them implies tls=true); the files are read now;
//   - sasl=plain|scram-sha-256|scram-sha-512 authenticates with sasl_user
//     and sasl_password, or $IDEM_KAFKA_SASL_PASSWORD when the URL has no
//     password;
//   - cloudevents=binary|structured and cloudevents_source=URI: a
//     publisher produces CloudEvents (PublisherConfig.CloudEvents).
//
// Any other parameter is an error. Errors name the parameter and never
// contain the password.
func ParseURL(rawURL string) (URLConfig, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("idem: kafka: URL %s: %s", broker.RedactURL(rawURL), fmt.Sprintf(format, args...))
	}
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok || !strings.EqualFold(scheme, "kafka") {
		return URLConfig{}, bad("want kafka://host:9092[,host2:9092]")
	}
	// Not url.Parse: it rejects the list of hosts.
	hosts, query, _ := strings.Cut(rest, "?")
	hosts = strings.TrimSuffix(hosts, "/")
	var c URLConfig
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			c.Brokers = append(c.Brokers, h)
		}
	}
	if len(c.Brokers) == 0 {
		return URLConfig{}, bad("no broker address (kafka://host:9092[,host2:9092])")
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return URLConfig{}, bad("%v", err)
	}
	for k := range q {
		if !slices.Contains(urlParams, k) {
			return URLConfig{}, bad("unknown parameter %q (want one of %s)", k, strings.Join(urlParams, ", "))
		}
	}
	c.TopicPrefix = q.Get("topic_prefix")
	if c.CloudEvents, err = broker.CloudEventsFromURL(q); err != nil {
		return URLConfig{}, bad("%v", err)
	}
	c.ClientID = q.Get("client_id")
	if v := q.Get("session_timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return URLConfig{}, bad("session_timeout %q: want a positive duration such as 10s", v)
		}
		c.Opts = append(c.Opts, kgo.SessionTimeout(d))
	}
	if c.TLS, err = urlTLS(q); err != nil {
		return URLConfig{}, bad("%v", err)
	}
	mech, err := urlSASL(q)
	if err != nil {
		return URLConfig{}, bad("%v", err)
	}
	if mech != nil {
		c.Opts = append(c.Opts, kgo.SASL(mech))
	}
	return c, nil
}

// urlTLS returns the TLS configuration of the parameters tls, tls_ca,
// tls_cert and tls_key, nil without TLS.
func urlTLS(q url.Values) (*tls.Config, error) {
	on := q.Get("tls")
	switch on {
	case "", "false", "true":
	default:
		return nil, fmt.Errorf("tls=%q: want true or false", on)
	}
	ca, cert, key := q.Get("tls_ca"), q.Get("tls_cert"), q.Get("tls_key")
	if on != "true" && ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	return tlsfiles.Files{CA: ca, Cert: cert, Key: key, CAParam: "tls_ca", CertParam: "tls_cert", KeyParam: "tls_key"}.Config()
}

// urlSASL returns the SASL mechanism of the parameters sasl, sasl_user and
// sasl_password, nil without SASL.
func urlSASL(q url.Values) (sasl.Mechanism, error) {
	name := strings.ToLower(q.Get("sasl"))
	user, pass := q.Get("sasl_user"), cmp.Or(q.Get("sasl_password"), os.Getenv("IDEM_KAFKA_SASL_PASSWORD"))
	if name == "" {
		if user != "" || q.Get("sasl_password") != "" {
			return nil, errors.New("sasl_user and sasl_password need sasl=plain, scram-sha-256 or scram-sha-512")
		}
		return nil, nil
	}
	if user == "" {
		return nil, fmt.Errorf("sasl=%s needs sasl_user", name)
	}
	switch name {
	case "plain":
		return plain.Auth{User: user, Pass: pass}.AsMechanism(), nil
	case "scram-sha-256":
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism(), nil
	case "scram-sha-512":
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("sasl=%q: want plain, scram-sha-256 or scram-sha-512", name)
}

// PublisherConfig returns the configuration of a publisher to the URL's
// cluster, routing to the topics <TopicPrefix><aggregate type>, producing
// CloudEvents if the URL says so.
func (c URLConfig) PublisherConfig() PublisherConfig {
	pc := PublisherConfig{ClientConfig: c.ClientConfig, CloudEvents: c.CloudEvents}
	if c.TopicPrefix != "" {
		pc.TopicReplacement = c.TopicPrefix + RoutedByValue
	}
	return pc
}

// SubscriberConfig returns the configuration of a subscriber of the URL's
// cluster and topic prefix; set its Group and Topics.
func (c URLConfig) SubscriberConfig() SubscriberConfig {
	return SubscriberConfig{ClientConfig: c.ClientConfig, TopicPrefix: c.TopicPrefix}
}
