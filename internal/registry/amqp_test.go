package registry

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/broker/amqp"
	"github.com/idem-go/idem/inbox"
)

func TestSubscribeAMQPPartitions(t *testing.T) {
	deliver := func(context.Context, []inbox.Delivery) ([]inbox.Disposition, []error) { return nil, nil }
	cfg := SubscribeConfig{Consumer: "stock", EventNames: []string{"order.order.placed.v1"}}
	if _, err := Subscribe("amqp://localhost/?partitions=8&partition=3", cfg, deliver); err != nil {
		t.Errorf("Subscribe with partitions=8&partition=3: %v", err)
	}
	if p, err := Partitions("amqp://localhost/?partitions=8&partition=3&queue_type=quorum"); p != 8 || err != nil {
		t.Errorf("Partitions = %d, %v; want 8", p, err)
	}
	for _, bad := range []string{"?partitions=x", "?partitions=4&partition=4", "?partition=1", "?partitions=-1"} {
		_, err := Subscribe("amqp://guest:secret@localhost/"+bad, cfg, deliver)
		if err == nil || !strings.Contains(err.Error(), "artition") || strings.Contains(err.Error(), "secret") {
			t.Errorf("Subscribe with %s: %v; want an error naming the partition setting, without the password", bad, err)
		}
	}
	if got := amqp.PartitionQueue("stock.events", 3); got != "stock.events.p3" {
		t.Errorf("PartitionQueue = %q", got)
	}
}
