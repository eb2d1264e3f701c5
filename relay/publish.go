package relay

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
	"github.com/idem-go/idem/relay/internal/ordered"
	"github.com/idem-go/idem/relay/internal/sendspan"
)

// item is one claimed row on its way to the broker.
type item struct {
	row *driver.ClaimedRow
	// outcome is what became of the row; err why it was not published.
	// unreadable: the row cannot become a message.
	outcome    ordered.Outcome
	err        error
	unreadable bool
	confirmed  time.Time
}

// Publish calls per batch: a batch keeps up to publishCalls calls in flight,
// each carrying at least minCallSize messages when that many are ready.
const (
	publishCalls = 4
	minCallSize  = 64
)

// process publishes a claimed batch, then settles it. The rows of one
// aggregate are published one after the other (package ordered): row k+1
// goes to the broker only once row k was confirmed; when a row fails, the
// later rows of its aggregate are not published. A row that cannot become
// a message is quarantined at once, and the later rows of its aggregate
// wait.
func (r *Relay[TTx]) process(log *slog.Logger, b *claimed) {
	items := make([]item, len(b.rows))
	entries := make([]*ordered.Entry, 0, len(b.rows))
	var stuck map[aggregateKey]bool // aggregates with an unreadable row
	for i := range b.rows {
		row := &b.rows[i]
		items[i].row = row
		k := aggregateKey{row.AggregateType, row.AggregateID}
		if stuck[k] {
			continue
		}
		msg, err := outboxcodec.Message(row.OutboxRecord)
		if err != nil {
			// Retrying cannot fix the row: quarantine it at once; the rest
			// of its aggregate waits.
			items[i].err, items[i].unreadable = err, true
			if stuck == nil {
				stuck = map[aggregateKey]bool{}
			}
			stuck[k] = true
			continue
		}
		entries = append(entries, &ordered.Entry{Key: row.AggregateType + "\x00" + row.AggregateID,
			Msg: msg, Refusals: row.Attempts, Ref: i})
	}

	// down is set, with the pause it started, when the broker answered for
	// no message of a call.
	var (
		downMu     sync.Mutex
		down       bool
		faultDelay = r.retryDelay(1)
	)
	p := ordered.New(r.workCtx, ordered.Config{
		Publish: func(ctx context.Context, batch []*ordered.Entry, msgs []idem.Message) error {
			spans := r.tracing.Start(ctx, msgs, func(j int) (int64, int) {
				row := items[batch[j].Ref].row
				return row.Seq, row.Attempts + 1
			})
			err := r.publish(ctx, msgs)
			sendspan.End(spans, err)
			return err
		},
		Calls:           publishCalls,
		MinCall:         minCallSize,
		Timeout:         r.cfg.PublishTimeout,
		QuarantineAfter: r.cfg.QuarantineAfter,
		Mode:            ordered.GiveBack,
		Proceed: func(started int) bool {
			if started > 0 && r.claimCtx.Err() != nil {
				return false // stopping: release what is left
			}
			if time.Until(b.deadline) < r.cfg.PublishTimeout+r.cfg.leaseMargin() {
				log.Warn("lease about to expire; releasing the rest of the batch")
				return false
			}
			return true
		},
		Down: func(err error) {
			// The broker is away: pause every worker, and count no attempt.
			downMu.Lock()
			defer downMu.Unlock()
			if !down {
				faultDelay, down = r.brokerFailed(err), true
			}
		},
		Answered: func(faults int) {
			r.brokerFailures.Store(0)
			if faults == 0 {
				r.errs.publish.OK(r.workCtx)
			}
		},
	})
	p.Add(entries...)
	p.Wait()
	for _, e := range entries {
		it := &items[e.Ref]
		it.outcome, it.err, it.confirmed = e.Outcome, e.Err, e.At
	}
	r.settle(log, b, items, faultDelay, down)
}
