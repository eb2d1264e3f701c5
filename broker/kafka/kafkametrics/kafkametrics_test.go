package kafkametrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem/broker/kafka"
	"github.com/idem-go/idem/broker/kafka/kafkametrics"
)

type fixed kafka.Stats

func (f fixed) Stats() kafka.Stats { return kafka.Stats(f) }

func TestCollector(t *testing.T) {
	counts := make([]uint64, len(kafka.DelayBuckets())+1)
	for i := range counts {
		counts[i] = 2
	}
	st := fixed{Handled: 5, Parked: 1, Retries: 3, Delay: kafka.DelayHistogram{Counts: counts, Count: 2, Sum: 3 * time.Millisecond},
		Partitions: []kafka.PartitionStats{{Topic: "outbox.event.order", Partition: 1, Committed: 10, HighWatermark: 14, Lag: 4}}}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(kafkametrics.NewCollector(st, "shipping"))
	want := `
# HELP idem_kafka_consumer_lag Records between the committed offset and the partition's end.
# TYPE idem_kafka_consumer_lag gauge
idem_kafka_consumer_lag{group="shipping",partition="1",topic="outbox.event.order"} 4
# HELP idem_kafka_parked_total Records parked in the failure store.
# TYPE idem_kafka_parked_total counter
idem_kafka_parked_total{group="shipping"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_kafka_consumer_lag", "idem_kafka_parked_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n < 10 {
		t.Errorf("gathered %d metrics, %v", n, err)
	}
}
