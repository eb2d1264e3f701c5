package cdcmetrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/cdc/cdcmetrics"
	"github.com/idem-go/idem/relay/logrelay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fixed logrelay.Stats

func (f fixed) Stats() logrelay.Stats { return logrelay.Stats(f) }

func TestCollect(t *testing.T) {
	m := cdcmetrics.New("idem_public_outbox")
	cfg := m.Instrument(cdc.Config{})
	cfg.Observer.Publish(3, 2*time.Millisecond, nil)
	cfg.Observer.CommitToPublish(4 * time.Millisecond)
	cfg.Observer.Confirm(20 * time.Millisecond)
	cfg.Observer.Stages(logrelay.Stages{Receive: time.Millisecond, Visible: time.Millisecond, Queue: time.Millisecond, Confirm: time.Millisecond})
	m.Watch(fixed{Published: 7, Archived: 6, ArchivePurged: 5, LagBytes: 1024, RetainedBytes: 4096, Lag: 1500 * time.Millisecond, Streaming: true, InFlight: 2})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	want := `
# HELP idem_cdc_published_total Messages the broker confirmed.
# TYPE idem_cdc_published_total counter
idem_cdc_published_total{slot="idem_public_outbox"} 7
# HELP idem_cdc_slot_lag_bytes WAL bytes between the server's current position and the slot's confirmed position.
# TYPE idem_cdc_slot_lag_bytes gauge
idem_cdc_slot_lag_bytes{slot="idem_public_outbox"} 1024
# HELP idem_cdc_slot_retained_bytes WAL bytes the slot keeps on the server (from its restart position).
# TYPE idem_cdc_slot_retained_bytes gauge
idem_cdc_slot_retained_bytes{slot="idem_public_outbox"} 4096
# HELP idem_cdc_lag_seconds Age of the oldest commit read and not yet confirmed; 0 when none waits.
# TYPE idem_cdc_lag_seconds gauge
idem_cdc_lag_seconds{slot="idem_public_outbox"} 1.5
# HELP idem_cdc_streaming 1 while the relay reads the slot.
# TYPE idem_cdc_streaming gauge
idem_cdc_streaming{slot="idem_public_outbox"} 1
# HELP idem_cdc_archived_total Events written into the outbox's archive, for idem replay.
# TYPE idem_cdc_archived_total counter
idem_cdc_archived_total{slot="idem_public_outbox"} 6
# HELP idem_cdc_archive_purged_total Archived events deleted after the archive's retention.
# TYPE idem_cdc_archive_purged_total counter
idem_cdc_archive_purged_total{slot="idem_public_outbox"} 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_cdc_published_total", "idem_cdc_slot_lag_bytes",
		"idem_cdc_slot_retained_bytes", "idem_cdc_lag_seconds", "idem_cdc_streaming", "idem_cdc_archived_total", "idem_cdc_archive_purged_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m, "idem_cdc_confirm_delay_seconds", "idem_cdc_publish_duration_seconds", "idem_cdc_commit_to_publish_seconds"); n != 3 {
		t.Fatalf("%d histograms", n)
	}
	if n := testutil.CollectAndCount(m, "idem_cdc_stage_seconds"); n != 4 {
		t.Fatalf("%d stage histograms, want receive, visible, queue and confirm", n)
	}
}
