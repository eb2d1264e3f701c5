package registry

import (
	"strings"
	"testing"
)

// TestNATSPartitionParameters: partitions=P is the stream's partition count
// (Partitions), a subscriber's URL without partition=k takes the one its
// caller gives, and bad values are refused with the parameter named.
func TestNATSPartitionParameters(t *testing.T) {
	if p, err := Partitions("nats://127.0.0.1:4222?partitions=8&partition=3&stream=S"); err != nil || p != 8 {
		t.Errorf("Partitions = %d, %v; want 8", p, err)
	}
	for _, c := range []struct {
		url       string
		partition int
	}{{"nats://h?partitions=4&partition=3", 3}, {"nats://h?partitions=4&partition=0", 0}, {"nats://h?partitions=4", 2}} {
		sub, err := subscribeNATS(c.url, SubscribeConfig{Consumer: "stock", Partition: 2}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := sub.(*natsSubscriber).partition; got != c.partition {
			t.Errorf("%s: partition %d, want %d", c.url, got, c.partition)
		}
	}
	if _, err := subscribeNATS("nats://h?partitions=2&partition=x", SubscribeConfig{Consumer: "stock"}, nil, nil); err == nil || !strings.Contains(err.Error(), "partition=") {
		t.Errorf("subscribeNATS with partition=x: %v; want an error naming partition", err)
	}
}

// TestNATSStreamPrefix: a prefix names the stream and subjects unless the
// URL names them.
func TestNATSStreamPrefix(t *testing.T) {
	for _, c := range []struct {
		url, prefix, name, subjects string
	}{
		{"nats://h", "", "", ""},
		{"nats://h", "shop.a", "SHOP_A_EVENTS", "shop.a.events"},
		{"nats://h?stream=S&prefix=ev", "shop", "S", "ev"},
	} {
		sub, err := subscribeNATS(c.url, SubscribeConfig{Consumer: "stock", Prefix: c.prefix}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if s := sub.(*natsSubscriber).stream; s.Name != c.name || s.SubjectPrefix != c.subjects {
			t.Errorf("%s with prefix %q: stream %q, subjects %q; want %q, %q", c.url, c.prefix, s.Name, s.SubjectPrefix, c.name, c.subjects)
		}
	}
}
