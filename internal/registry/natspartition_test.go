package registry

import (
	"context"
	"testing"
)

// TestNATSPartitionParameters: partitions=P sets the stream's partition
// count and partition=k the subscriber's partition; bad values are refused
// with the parameter named; neither reaches the server URL.
func TestNATSPartitionParameters(t *testing.T) {
	u, err := parseURL("nats://127.0.0.1:4222?partitions=8&partition=3&stream=S")
	if err != nil {
		t.Fatal(err)
	}
	s, err := natsStream(u, "")
	if err != nil || s.Partitions != 8 || s.Name != "S" {
		t.Errorf("natsStream: %+v, %v; want 8 partitions of stream S", s, err)
	}
	if k, err := natsPartition(u); err != nil || k != 3 {
		t.Errorf("natsPartition: %d, %v; want 3", k, err)
	}
	cc, release, err := natsConn(context.Background(), u, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = release() }()
	if cc.URL != "nats://127.0.0.1:4222" {
		t.Errorf("server URL %s, want nats://127.0.0.1:4222", cc.URL)
	}
	for _, raw := range []string{"nats://h?partitions=x", "nats://h?partitions=-1", "nats://h?partitions=100000"} {
		u, err := parseURL(raw)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := natsStream(u, ""); err == nil {
			t.Errorf("%s: no error", raw)
		}
	}
	u, err = parseURL("nats://h?partition=-2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsPartition(u); err == nil {
		t.Error("partition=-2: no error")
	}
	if _, err := subscribeNATS("nats://h?partitions=2&partition=x", SubscribeConfig{Consumer: "stock"}, nil, nil); err == nil {
		t.Error("subscribeNATS with partition=x: no error")
	}
}
