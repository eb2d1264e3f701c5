package relay

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/outboxcodec"
	"github.com/idem-go/idem/relay/internal/ordered"
)

// ReplayFilter selects the events of a replay: published rows still in the
// outbox. Zero fields match all.
type ReplayFilter struct {
	// Since and Until bound the events' occurred_at: Since <= occurred_at <
	// Until.
	Since, Until time.Time
	// EventName keeps only events with this name.
	EventName string
	// AggregateType keeps only events of this aggregate type.
	AggregateType string
}

// ReplayOptions adjust Replay.
type ReplayOptions struct {
	// BatchSize is the number of rows read per query. Defaults to 1000.
	BatchSize int
	// PublishTimeout bounds each Publish call. Defaults to 30s.
	PublishTimeout time.Duration
	// Progress, when set, is called after each page with the number of
	// events published so far.
	Progress func(published int64)
}

// Source is what Replay and ReplayCounts need from a driver: every
// driver.Driver has it.
type Source interface {
	Dialect() driver.Dialect
	Pool() driver.Executor
}

func (f ReplayFilter) driver() driver.ReplayFilter {
	return driver.ReplayFilter{Since: f.Since, Until: f.Until, EventName: f.EventName, AggregateType: f.AggregateType}
}

func (f ReplayFilter) validate() error {
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return fmt.Errorf("idem: replay: Until %s is not after Since %s", f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339))
	}
	return nil
}

// ReplayCounts returns how many events Replay would publish for f, per event
// name: the dry run shown before a replay.
func ReplayCounts(ctx context.Context, src Source, f ReplayFilter) (map[string]int64, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	return src.Dialect().ReplayCounts(ctx, src.Pool(), f.driver())
}

// Replay publishes again, through pub, the published events f selects that
// are still in the outbox (see Config.Retention), with their original event
// ids so that consumers skip them as duplicates unless they lost them. Events
// of one aggregate are published in their original order, each once the
// previous one was confirmed, several calls in flight. Replay stops after
// the first page with a failure and returns how many events it published;
// running it again is harmless.
func Replay(ctx context.Context, src Source, pub broker.Publisher, f ReplayFilter, opts ReplayOptions) (int64, error) {
	if err := f.validate(); err != nil {
		return 0, err
	}
	d := src.Dialect()
	limit := cmp.Or(opts.BatchSize, BatchSizeDefault)
	timeout := cmp.Or(opts.PublishTimeout, 30*time.Second)
	var published, after int64
	for {
		rows, err := d.ReplayRows(ctx, src.Pool(), f.driver(), after, limit)
		if err != nil {
			return published, fmt.Errorf("idem: replay: read the outbox: %w", err)
		}
		if len(rows) == 0 {
			return published, nil
		}
		after = rows[len(rows)-1].Seq

		entries := make([]*ordered.Entry, len(rows))
		for i, row := range rows {
			msg, err := outboxcodec.Message(row)
			if err != nil {
				return published, fmt.Errorf("idem: replay: %w", err)
			}
			entries[i] = &ordered.Entry{Key: row.AggregateType + "\x00" + row.AggregateID, Msg: msg}
		}
		p := ordered.New(ctx, ordered.Config{
			Publish: func(ctx context.Context, _ []*ordered.Entry, msgs []idem.Message) error {
				return pub.Publish(ctx, msgs)
			},
			Calls:   replayCalls,
			MinCall: replayMinCall,
			Timeout: timeout,
			Mode:    ordered.GiveBack,
		})
		p.Add(entries...)
		p.Wait()
		var failed error
		for _, e := range entries {
			switch {
			case e.Outcome == ordered.Published:
				published++
			case failed == nil && e.Err != nil:
				failed = e.Err
			}
		}
		if err := cmp.Or(ctx.Err(), failed); err != nil {
			return published, fmt.Errorf("idem: replay: publish: %w", err)
		}
		if opts.Progress != nil {
			opts.Progress(published)
		}
		if len(rows) < limit {
			return published, nil
		}
	}
}

// The calls in flight of a replay, and the fewest messages in each when that
// many are ready.
const (
	replayCalls   = 4
	replayMinCall = 64
)
