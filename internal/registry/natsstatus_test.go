package registry

import (
	"context"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/broker/nats/embedded"
)

// TestNATSStatusPartitionedStream: "idem status" (OpenInspector) on a
// partitioned stream whose URL does not say partitions=P reads P from the
// stream and reports each partition's durable consumer.
func TestNATSStatusPartitionedStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = srv.Shutdown(context.Background()) }()
	pub, err := Open(ctx, srv.ClientURL()+"?stream=PS&prefix=ps&partitions=3")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = pub.Close() }()
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, "PS", jetstream.ConsumerConfig{Durable: "stock-p1", FilterSubject: "ps-p.1.>"}); err != nil {
		t.Fatal(err)
	}
	insp, err := OpenInspector(ctx, srv.ClientURL()+"?stream=PS&prefix=ps", "")
	if err != nil {
		t.Fatalf("status without partitions=3 in the URL: %v", err)
	}
	defer func() { _ = insp.Close() }()
	stats, err := insp.Inspect(ctx, []string{"stock"})
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 || stats[0].Queue != "PS/stock-p1" {
		t.Errorf("inspected %+v, want the durable consumer stock-p1 of stream PS", stats)
	}
	// partitions=P in the URL is still checked against the stream.
	if insp, err := OpenInspector(ctx, srv.ClientURL()+"?stream=PS&prefix=ps&partitions=2", ""); err == nil {
		_ = insp.Close()
		t.Error("status with partitions=2 on a stream of 3: no error")
	}
}
