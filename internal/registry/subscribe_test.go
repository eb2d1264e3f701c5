package registry

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/inbox"
)

func TestSubscribeAMQPQueueType(t *testing.T) {
	deliver := func(context.Context, []inbox.Delivery) ([]inbox.Disposition, []error) { return nil, nil }
	cfg := SubscribeConfig{Consumer: "stock", EventNames: []string{"order.order.placed.v1"}}
	for _, u := range []string{"amqp://guest:guest@localhost:5672/", "amqp://localhost/?queue_type=quorum", "amqp://localhost/?queue_type=classic&heartbeat=10"} {
		if _, err := Subscribe(u, cfg, deliver); err != nil {
			t.Errorf("Subscribe(%s): %v", u, err)
		}
	}
	_, err := Subscribe("amqp://guest:secret@localhost/?queue_type=stream", cfg, deliver)
	if err == nil || !strings.Contains(err.Error(), "queue_type") || strings.Contains(err.Error(), "secret") {
		t.Errorf("Subscribe with queue_type=stream: %v; want an error naming queue_type, without the password", err)
	}
}
