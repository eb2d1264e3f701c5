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
// outbox, and the events a CDC relay archived (see Archive). Zero fields
// match all.
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
	counts, err := src.Dialect().ReplayCounts(ctx, src.Pool(), f.driver())
	if err != nil {
		return nil, err
	}
	a, ok := src.Dialect().(driver.OutboxArchiver)
	if !ok {
		return counts, nil
	}
	info, err := a.ArchiveInfo(ctx, src.Pool())
	if err != nil || !info.Exists || info.Empty {
		return counts, err
	}
	archived, err := a.ArchiveCounts(ctx, src.Pool(), f.driver())
	if err != nil {
		return nil, fmt.Errorf("idem: replay: read the archive: %w", err)
	}
	for name, n := range archived {
		counts[name] += n
	}
	return counts, nil
}

// Archive describes the archive of the outbox of src, where the CDC relays
// (relay/cdc, relay/binlog) keep the events they published when their
// archive is on (cdc.Config.ArchiveRetention): ok is false when the dialect
// has none (SQLite, which has no CDC relay); ArchiveInfo.Exists is false
// when the database lacks its table (migration 0013).
func Archive(ctx context.Context, src Source) (info driver.ArchiveInfo, ok bool, err error) {
	a, ok := src.Dialect().(driver.OutboxArchiver)
	if !ok {
		return driver.ArchiveInfo{}, false, nil
	}
	info, err = a.ArchiveInfo(ctx, src.Pool())
	if err != nil {
		return info, true, fmt.Errorf("idem: replay: read the archive: %w", err)
	}
	return info, true, nil
}

// replaySource is where Replay reads events: the outbox's published rows,
// or the archive.
type replaySource struct {
	what string
	page func(ctx context.Context, after int64, limit int) ([]driver.OutboxRecord, error)
}

// Replay publishes again, through pub, the published events f selects that
// are still in the outbox (see Config.Retention), then those a CDC relay
// archived (see Archive) that are not in the outbox too, with their
// original event ids so that consumers skip them as duplicates unless they
// lost them. Events of one aggregate are published in their original order
// (the outbox's seq, the archive's order of publication), each once the
// previous one was confirmed, several calls in flight. When both sources
// hold events of the period (the polling relay published some, a CDC relay
// the others: one replaced the other during the period), the one whose
// events of the period came first is replayed first: the outbox's when its
// first row was written before the archive's first event was published
// (a move from the polling relay to CDC), the archive's otherwise (a move
// back), so that an aggregate's events keep their order across the move. Replay stops after the first page with a failure and returns how
// many events it published; running it again is harmless.
func Replay(ctx context.Context, src Source, pub broker.Publisher, f ReplayFilter, opts ReplayOptions) (int64, error) {
	if err := f.validate(); err != nil {
		return 0, err
	}
	d := src.Dialect()
	df := f.driver()
	sources := []replaySource{{what: "the outbox", page: func(ctx context.Context, after int64, limit int) ([]driver.OutboxRecord, error) {
		return d.ReplayRows(ctx, src.Pool(), df, after, limit)
	}}}
	if a, ok := d.(driver.OutboxArchiver); ok {
		info, err := a.ArchiveInfo(ctx, src.Pool())
		if err != nil {
			return 0, fmt.Errorf("idem: replay: read the archive: %w", err)
		}
		if info.Exists && !info.Empty {
			sources = append(sources, replaySource{what: "the archive", page: func(ctx context.Context, after int64, limit int) ([]driver.OutboxRecord, error) {
				return a.ArchiveRows(ctx, src.Pool(), df, after, limit)
			}})
			first, err := archiveFirst(ctx, sources[0], sources[1])
			if err != nil {
				return 0, err
			}
			if first {
				sources[0], sources[1] = sources[1], sources[0]
			}
		}
	}
	limit := cmp.Or(opts.BatchSize, BatchSizeDefault)
	timeout := cmp.Or(opts.PublishTimeout, 30*time.Second)
	var published int64
	for _, s := range sources {
		n, err := replayFrom(ctx, s, pub, limit, timeout, published, opts.Progress)
		published += n
		if err != nil {
			return published, err
		}
	}
	return published, nil
}

// archiveFirst reports whether the archive's events of the period came
// before the outbox's published rows: the first archived event (by seq)
// was published before the first outbox row (by seq) was written. Either
// source without events of the period leaves the outbox first.
func archiveFirst(ctx context.Context, outbox, archive replaySource) (bool, error) {
	o, err := outbox.page(ctx, 0, 1)
	if err != nil {
		return false, fmt.Errorf("idem: replay: read %s: %w", outbox.what, err)
	}
	a, err := archive.page(ctx, 0, 1)
	if err != nil {
		return false, fmt.Errorf("idem: replay: read %s: %w", archive.what, err)
	}
	// An outbox row's CreatedAt is its created_at; an archived event's, its
	// published_at.
	return len(o) == 1 && len(a) == 1 && a[0].CreatedAt.Before(o[0].CreatedAt), nil
}

// replayFrom publishes the events of one source, a page at a time, and
// returns how many it published; before is the count of the sources
// replayed before it, for Progress.
func replayFrom(ctx context.Context, s replaySource, pub broker.Publisher, limit int, timeout time.Duration, before int64, progress func(int64)) (int64, error) {
	var published, after int64
	for {
		rows, err := s.page(ctx, after, limit)
		if err != nil {
			return published, fmt.Errorf("idem: replay: read %s: %w", s.what, err)
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
		if progress != nil {
			progress(before + published)
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
