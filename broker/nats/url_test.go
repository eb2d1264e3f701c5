package nats_test

import (
	"fmt"
	"log"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/broker/nats"
)

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		name, url string
		want      nats.URLConfig
		options   int // nats.go options: ca, cert and key, creds
	}{
		{"a server", "nats://user:pass@127.0.0.1:4222",
			nats.URLConfig{ConnConfig: nats.ConnConfig{URL: "nats://user:pass@127.0.0.1:4222"}}, 0},
		{"a cluster reaches the client whole", "nats://a:4222,b:4222,c:4222?stream=S&replicas=3",
			nats.URLConfig{ConnConfig: nats.ConnConfig{URL: "nats://a:4222,b:4222,c:4222"},
				Stream: nats.StreamConfig{Name: "S", Replicas: 3}}, 0},
		{"a cluster of URLs", "nats://a:4222,nats://b:4222,nats://c:4222?replicas=3&ack_wait=5s",
			nats.URLConfig{ConnConfig: nats.ConnConfig{URL: "nats://a:4222,nats://b:4222,nats://c:4222"},
				Stream: nats.StreamConfig{Replicas: 3}, AckWait: 5 * time.Second}, 0},
		{"TLS files", "tls://a:4222,b:4222?replicas=3&stream=S&ca=ca.pem&cert=c.pem&key=k.pem&creds=u.creds",
			nats.URLConfig{ConnConfig: nats.ConnConfig{URL: "tls://a:4222,b:4222"},
				Stream: nats.StreamConfig{Name: "S", Replicas: 3}}, 3},
		{"partitions, partition, prefix; the server's parameters kept", "nats://127.0.0.1:4222?partitions=8&partition=3&stream=S&prefix=ev&other=1",
			nats.URLConfig{ConnConfig: nats.ConnConfig{URL: "nats://127.0.0.1:4222?other=1"},
				Stream: nats.StreamConfig{Name: "S", SubjectPrefix: "ev", Partitions: 8}, PartitionsSet: true, Partition: 3, PartitionSet: true}, 0},
		{"partitions=0 named", "nats://h:4222?partitions=0",
			nats.URLConfig{ConnConfig: nats.ConnConfig{URL: "nats://h:4222"}, PartitionsSet: true}, 0},
		{"embedded", "embedded",
			nats.URLConfig{Embedded: &nats.EmbeddedServer{SyncAlways: true}}, 0},
		{"embedded with its parameters", "embedded?dir=data/nats&listen=127.0.0.1:4222&sync=interval&stream=S&partitions=2",
			nats.URLConfig{Stream: nats.StreamConfig{Name: "S", Partitions: 2}, PartitionsSet: true,
				Embedded: &nats.EmbeddedServer{Dir: "data/nats", Listen: "127.0.0.1:4222"}}, 0},
		{"nats://embedded", "nats://embedded?sync=always",
			nats.URLConfig{Embedded: &nats.EmbeddedServer{SyncAlways: true}}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := nats.ParseURL(c.url)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Options) != c.options {
				t.Errorf("ParseURL(%q): %d options, want %d", c.url, len(got.Options), c.options)
			}
			got.Options = nil
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("ParseURL(%q)\n = %+v %+v\nwant %+v %+v", c.url, got, got.Embedded, c.want, c.want.Embedded)
			}
		})
	}
}

func TestParseURLErrors(t *testing.T) {
	for _, c := range []struct {
		url, want string // want: in the error
	}{
		{"nats://u:s3cret@h:4222/%zz", "invalid URL escape"},
		{"nats://u:s3cret@h?partitions=x", `partitions="x": want a number from 0 (unpartitioned) to ` + strconv.Itoa(nats.PartitionsMax)},
		{"nats://u:s3cret@h?partitions=-1", `partitions="-1"`},
		{"nats://u:s3cret@h?partitions=100000", `partitions="100000"`},
		{"nats://u:s3cret@h?replicas=0", `replicas="0": want the number of servers`},
		{"nats://u:s3cret@h?replicas=three", `replicas="three"`},
		{"nats://u:s3cret@h?partition=-2", `partition="-2": want a number from 0 to partitions-1`},
		{"nats://u:s3cret@h?partitions=2&partition=x", `partition="x"`},
		{"nats://u:s3cret@h?ack_wait=500ms", `ack_wait="500ms": want a duration of at least 1s`},
		{"nats://u:s3cret@h?ack_wait=soon", `ack_wait="soon"`},
		{"tls://u:s3cret@h?cert=c.pem", "cert and key go together"},
		{"tls://u:s3cret@h?key=k.pem", "cert and key go together"},
		{"embedded?sync=never", `sync="never": want always`},
	} {
		_, err := nats.ParseURL(c.url)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "idem: nats: ") {
			t.Errorf("ParseURL(%q): %v; want an error with %q", c.url, err, c.want)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("ParseURL(%q): %v shows the password", c.url, err)
		}
	}
}

// The URL the idem command takes gives the configuration of a publisher
// and of a subscriber, which sets its consumer and bindings.
func ExampleParseURL() {
	u, err := nats.ParseURL("nats://n1:4222,n2:4222,n3:4222?replicas=3&partitions=4&partition=2&creds=relay.creds")
	if err != nil {
		log.Fatal(err)
	}
	pc := u.PublisherConfig() // nats.NewPublisher(ctx, pc)
	fmt.Println(pc.URL, pc.Stream.Replicas, pc.Stream.Partitions, len(pc.Options))

	sc := u.SubscriberConfig() // nats.NewSubscriber(sc, deliver)
	sc.Consumer, sc.Bindings = "stock", []string{"order.>"}
	fmt.Println(sc.Partition)
	// Output:
	// nats://n1:4222,n2:4222,n3:4222 3 4 1
	// 2
}
