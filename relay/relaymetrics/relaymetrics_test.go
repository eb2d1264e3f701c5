package relaymetrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem/relay"
	"github.com/idem-go/idem/relay/relaymetrics"
)

type fixed relay.Stats

func (f fixed) Stats() relay.Stats { return relay.Stats(f) }

// TestQuarantineMetrics: quarantined rows are a gauge of their own, apart
// from the backlog, and the relay's quarantines a counter.
func TestQuarantineMetrics(t *testing.T) {
	m := relaymetrics.New()
	m.Watch(fixed{Backlog: 7, QuarantinedRows: 2, Quarantined: 3, Published: 40})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	want := `
# HELP idem_relay_backlog_rows Unpublished outbox rows, quarantined ones excluded.
# TYPE idem_relay_backlog_rows gauge
idem_relay_backlog_rows 7
# HELP idem_relay_quarantined_rows Quarantined outbox rows: unpublished, holding the later rows of their aggregates back until re-driven or removed.
# TYPE idem_relay_quarantined_rows gauge
idem_relay_quarantined_rows 2
# HELP idem_relay_quarantined_total Rows this relay quarantined: unreadable, or refused by the broker on every allowed attempt.
# TYPE idem_relay_quarantined_total counter
idem_relay_quarantined_total 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"idem_relay_backlog_rows", "idem_relay_quarantined_rows", "idem_relay_quarantined_total"); err != nil {
		t.Error(err)
	}
}

// TestClaimMetrics: claims that found rows, claims that found nothing and
// wake-ups are counters of their own.
func TestClaimMetrics(t *testing.T) {
	m := relaymetrics.New()
	m.Watch(fixed{Claims: 5, EmptyClaims: 9, Wakeups: 4})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	want := `
# HELP idem_relay_claims_total Claims that returned rows.
# TYPE idem_relay_claims_total counter
idem_relay_claims_total 5
# HELP idem_relay_empty_claims_total Claims that found nothing.
# TYPE idem_relay_empty_claims_total counter
idem_relay_empty_claims_total 9
# HELP idem_relay_wakeups_total Wake-ups from outside: notifications from the database, Relay.Notify.
# TYPE idem_relay_wakeups_total counter
idem_relay_wakeups_total 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"idem_relay_claims_total", "idem_relay_empty_claims_total", "idem_relay_wakeups_total"); err != nil {
		t.Error(err)
	}
}

// TestScheduledMetric: delayed rows not due yet are a gauge of their own,
// apart from the backlog.
func TestScheduledMetric(t *testing.T) {
	m := relaymetrics.New()
	m.Watch(fixed{Backlog: 1, Scheduled: 5})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	want := `
# HELP idem_relay_backlog_rows Unpublished outbox rows, quarantined ones excluded.
# TYPE idem_relay_backlog_rows gauge
idem_relay_backlog_rows 1
# HELP idem_relay_scheduled_rows Delayed outbox rows (idem.Event.NotBefore) not due yet; backlog_rows leaves them out.
# TYPE idem_relay_scheduled_rows gauge
idem_relay_scheduled_rows 5
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_relay_backlog_rows", "idem_relay_scheduled_rows"); err != nil {
		t.Error(err)
	}
}
