package logengine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem/driver"
)

// session holds the log for one Reader: it publishes the rows waiting at
// the first start, then reads the log until Stop or an error. read reports
// whether it read from the log at all.
func (r *Relay) session() (read bool, err error) {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	// Nothing is in flight while the adapter takes the log: a Stop ends
	// it.
	leadCtx, cancelLead := context.WithCancel(ctx)
	stopped := context.AfterFunc(r.base.StopContext(), cancelLead)
	rd, err := r.src.Lead(leadCtx)
	stopped()
	cancelLead()
	if err != nil {
		return false, err
	}
	defer rd.Close()
	if in := rd.Initial(); in != nil {
		err := r.publishInitial(ctx, in)
		in.Close()
		if err != nil {
			return false, err
		}
	}
	if err := rd.Start(ctx); err != nil {
		return false, err
	}
	if r.C.Waiting.Swap(false) {
		r.log.Info(r.cfg.TookOver)
	}
	r.C.Streaming.Store(true)
	defer r.C.Streaming.Store(false)
	if r.setup.Delayed {
		// Delayed rows are published from the table by the relay that
		// holds the log, and by it only.
		dueCtx, stopDue := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); r.dueLoop(dueCtx) }()
		defer func() { stopDue(); <-done }()
	}
	r.SetErr(nil)
	r.errs.replication.OK(ctx)
	r.log.Debug("replication started")

	s := &reading{r: r, rd: rd, pipe: newPipeline(ctx, r, rd)}
	defer func() {
		cancel()
		s.pipe.wait()
		r.C.InFlight.Store(0)
		r.C.Oldest.Store(0)
	}()
	return true, s.loop(ctx)
}

// reading is the state of one session's reading.
type reading struct {
	r    *Relay
	rd   Reader
	pipe *pipeline

	toDelete []string
	// toArchive holds the events published and not archived yet
	// (Config.ArchiveRetention), in log order.
	toArchive []*driver.OutboxRecord
	// pending is what was confirmed and not made durable yet.
	pending confirmed
	// deleteFailures counts the failed deletes in a row; none is tried
	// before deleteAfter.
	deleteFailures int
	deleteAfter    time.Time
}

func (s *reading) loop(ctx context.Context) error {
	r := s.r
	stopping := r.base.Stopping()
	nextFlush := time.Now().Add(r.cfg.FlushInterval)
	for {
		select {
		case <-stopping:
			return s.drain(ctx)
		default:
		}
		if !time.Now().Before(nextFlush) {
			if err := s.flush(ctx, false); err != nil {
				return err
			}
			nextFlush = time.Now().Add(r.cfg.FlushInterval)
		}
		if s.pipe.full() {
			t := time.NewTimer(time.Until(nextFlush))
			select {
			case <-s.pipe.progress:
			case <-t.C:
			case <-stopping:
			case <-ctx.Done():
			}
			t.Stop()
			continue
		}
		rd, err := s.rd.Read(ctx, nextFlush, stopping)
		if err != nil {
			return err
		}
		if rd.Tx != nil {
			s.pipe.add(rd.Tx)
		}
		if rd.Flush {
			if err := s.flush(ctx, true); err != nil {
				return err
			}
		}
	}
}

// drain ends a session on Stop: the messages handed to the broker are
// confirmed (or abandoned with the relay's context), the rows deleted and
// the position made durable.
func (s *reading) drain(ctx context.Context) error {
	if !s.pipe.drainWait(ctx) {
		return nil
	}
	return s.flush(ctx, true)
}

// errDeleteLater says that a delete waits for its backoff.
var errDeleteLater = errors.New("idem: delete waits for its backoff")

// flush deletes the published rows (and archives their events), then makes
// the position they reach durable. With force, the Reader confirms even a
// position that did not move (at a stop, or when the server asked).
func (s *reading) flush(ctx context.Context, force bool) error {
	r := s.r
	c := s.pipe.confirmed()
	s.toDelete = append(s.toDelete, c.ids...)
	s.toArchive = append(s.toArchive, c.archive...)
	if c.end != nil {
		s.pending.end = c.end
		s.pending.events = s.pending.events || c.events
		s.pending.foreign = s.pending.foreign || c.foreign
		s.pending.commits = append(s.pending.commits, c.commits...)
	}
	pos := s.pending.end
	if len(s.toDelete) > 0 || len(s.toArchive) > 0 {
		err := errDeleteLater
		if !time.Now().Before(s.deleteAfter) {
			err = s.deleteRows(ctx)
		}
		switch {
		case err == nil:
			s.deleteFailures = 0
			r.errs.delete.OK(ctx)
		case err != errDeleteLater && r.src.Gone(err):
			// A server shutting down may wait for what it sent to be
			// confirmed, and refuse the deletes the position waits for:
			// leave, and resume from the durable position.
			return fmt.Errorf("idem: %s: delete published rows: %w", r.cfg.Name, err)
		default:
			// The position waits for the rows: try again after a backoff.
			if err != errDeleteLater {
				s.deleteFailures++
				d := r.Backoff(s.deleteFailures)
				s.deleteAfter = time.Now().Add(d)
				r.errs.delete.Warn(ctx, "deleting published rows failed; their position waits", err, "rows", len(s.toDelete),
					"retry_in", d.Round(time.Millisecond))
			}
			pos = nil
		}
	}
	cf := Confirm{Events: s.pending.events, Foreign: s.pending.foreign, Force: force,
		Idle: s.pipe.empty() && len(s.toDelete) == 0 && len(s.toArchive) == 0}
	if pos != nil {
		cf.Pos = pos.pos
	}
	done, err := s.rd.Confirm(ctx, cf)
	if err != nil {
		return err
	}
	if done && pos != nil {
		if r.cfg.Observer.Confirm != nil {
			now := time.Now()
			for _, c := range s.pending.commits {
				r.cfg.Observer.Confirm(now.Sub(c))
			}
		}
		s.pending = confirmed{}
	}
	return nil
}

// deleteRows deletes the published rows and, when the relay archives what
// it publishes, archives the published events at once: deleted and
// archived together, or neither. Their transactions are visible: nothing
// is published before (pipeline.watch).
func (s *reading) deleteRows(ctx context.Context) error {
	r := s.r
	for len(s.toDelete) > 0 || len(s.toArchive) > 0 {
		n, m := min(len(s.toDelete), 1000), min(len(s.toArchive), 1000)
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		deleted, archived, err := r.src.Delete(qctx, s.toDelete[:n], s.toArchive[:m])
		cancel()
		if err != nil {
			return err
		}
		r.C.Deleted.Add(deleted)
		r.C.Archived.Add(archived)
		s.toDelete, s.toArchive = s.toDelete[n:], s.toArchive[m:]
	}
	s.toDelete, s.toArchive = nil, nil
	return nil
}
