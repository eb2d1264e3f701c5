package amqp_test

import (
	"fmt"
	"log"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/internal/testtls"
)

func TestParseURL(t *testing.T) {
	t.Setenv("IDEM_AMQP_USERNAME", "envuser")
	t.Setenv("IDEM_AMQP_PASSWORD", "envpass")
	pki := testtls.New(t)
	files := "cacertfile=" + pki.CA + "&certfile=" + pki.ClientCert + "&keyfile=" + pki.ClientKey
	for _, c := range []struct {
		name, url string
		want      amqp.URLConfig
	}{
		{"plain", "amqp://guest:guest@localhost:5672/",
			amqp.URLConfig{ConnConfig: amqp.ConnConfig{URL: "amqp://guest:guest@localhost:5672/"}}},
		{"idem's parameters removed, amqp091-go's kept",
			"amqp://u:s3cret@h:5672/vh?queue_type=quorum&exchange=ev&heartbeat=5&partitions=8&partition=3#frag",
			amqp.URLConfig{ConnConfig: amqp.ConnConfig{URL: "amqp://u:s3cret@h:5672/vh?heartbeat=5"},
				Exchange: "ev", QueueType: amqp.Quorum, Partitions: 8, Partition: 3, PartitionSet: true}},
		{"a cluster keeps its hosts",
			"amqp://u:s3cret@h1:5672,h2:5673,[::1]:5674/vh?queue_type=quorum&exchange=ev&heartbeat=5",
			amqp.URLConfig{ConnConfig: amqp.ConnConfig{URL: "amqp://u:s3cret@h1:5672,h2:5673,[::1]:5674/vh?heartbeat=5"},
				Exchange: "ev", QueueType: amqp.Quorum}},
		{"TLS files stay for amqp091-go",
			"amqps://u:p@h/?" + files + "&queue_type=classic",
			amqp.URLConfig{ConnConfig: amqp.ConnConfig{URL: "amqps://u:p@h/?" + url.Values{
				"cacertfile": {pki.CA}, "certfile": {pki.ClientCert}, "keyfile": {pki.ClientKey}}.Encode()},
				QueueType: amqp.Classic}},
		{"partition 0 named", "amqp://u:p@h/?partitions=2&partition=0",
			amqp.URLConfig{ConnConfig: amqp.ConnConfig{URL: "amqp://u:p@h/"}, Partitions: 2, PartitionSet: true}},
		{"credentials from the environment", "amqp://h:5672/",
			amqp.URLConfig{ConnConfig: amqp.ConnConfig{URL: "amqp://h:5672/", Username: "envuser", Password: "envpass"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := amqp.ParseURL(c.url)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", c.want) {
				t.Errorf("ParseURL(%q)\n = %+v\nwant %+v", c.url, got, c.want)
			}
		})
	}
}

func TestParseURLErrors(t *testing.T) {
	pki := testtls.New(t)
	for _, c := range []struct {
		url, want string // want: in the error
	}{
		{"localhost:5672", "not a URL"},
		{"http://u:s3cret@h/", `scheme "http"`},
		{"amqp://u:s3cret@h1,,h2/", "empty host"},
		{"amqp://u:s3cret@:5672/vh", "no host"},
		{"amqp://u:s3cret@ h /vh", "invalid character"},
		{"amqp://u:s3cret@h/?queue_type=stream", `queue_type="stream": want "classic" or "quorum"`},
		{"amqp://u:s3cret@h/?partitions=x", `partitions="x": want a number`},
		{"amqp://u:s3cret@h/?partitions=-1", `partitions="-1"`},
		{"amqp://u:s3cret@h/?partitions=2&partition=-2", `partition="-2"`},
		{"amqp://u:s3cret@h/?cacertfile=" + pki.CA, "are for amqps:// URLs"},
		{"amqps://u:s3cret@h/?cacertfile=/nonexistent/ca.pem", "cacertfile: open /nonexistent/ca.pem"},
		{"amqps://u:s3cret@h/?cacertfile=" + pki.ClientKey, "no PEM certificate"},
		{"amqps://u:s3cret@h/?certfile=" + pki.ClientCert, "certfile and keyfile go together"},
		{"amqps://u:s3cret@h/?certfile=" + pki.ClientCert + "&keyfile=" + pki.ServerKey, "certfile/keyfile: tls: private key does not match public key"},
	} {
		_, err := amqp.ParseURL(c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "idem: amqp: ") {
			t.Errorf("ParseURL(%q): %v; want an error with %q", c.url, err, c.want)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseURL(%q): %v shows the password", c.url, err)
		}
	}
}

// The URL the idem command takes gives the configuration of a publisher
// and of a subscriber, which sets its queue and bindings.
func ExampleParseURL() {
	u, err := amqp.ParseURL("amqp://guest:guest@localhost:5672/?exchange=shop.events&queue_type=quorum&partitions=4&partition=1")
	if err != nil {
		log.Fatal(err)
	}
	pub, err := amqp.NewPublisher(u.PublisherConfig()) // Connect connects it
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	sc := u.SubscriberConfig()
	sc.Queue, sc.Bindings = "stock.events", []string{"order.#"}
	fmt.Println(sc.URL)
	fmt.Println(sc.Exchange, sc.QueueType, sc.ConsumedQueue())
	// Output:
	// amqp://guest:guest@localhost:5672/
	// shop.events quorum stock.events.p1
}
