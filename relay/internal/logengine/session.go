package logengine

import (
	"context"
	"time"
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

	s := &reading{r: r, rd: rd, pipe: newPipeline(ctx, r, rd), w: newWriter(r)}
	wrote := make(chan struct{})
	go func() { defer close(wrote); s.w.run(ctx) }()
	defer func() {
		cancel()
		s.pipe.wait()
		<-wrote
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
	// w deletes the published rows and archives their events, beside
	// the reading.
	w *writer
	// pending is what w wrote and the Reader did not make durable yet.
	pending confirmed
}

// loop reads the log until Stop or an error, handing transactions to the
// pipeline and making positions durable every FlushInterval.
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
			if err := s.flush(ctx, false, false); err != nil {
				return err
			}
			nextFlush = time.Now().Add(r.cfg.FlushInterval)
		}
		if s.pipe.full() || s.w.full() {
			t := time.NewTimer(time.Until(nextFlush))
			select {
			case <-s.pipe.progress:
			case <-s.w.progress:
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
			if err := s.flush(ctx, true, false); err != nil {
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
	return s.flush(ctx, true, true)
}

// flush hands what the broker confirmed to the writer, then makes durable
// the position the writer reached: the end of the last transaction whose
// messages, and all before, are published and whose rows are deleted.
// With force, the Reader confirms even a position that did not move (at a
// stop, or when the server asked); with wait, it first waits for the
// writer to write everything (at a stop).
func (s *reading) flush(ctx context.Context, force, wait bool) error {
	r := s.r
	s.w.add(s.pipe.confirmed())
	if wait && !s.w.waitIdle(ctx) {
		return nil
	}
	wrote, idle, err := s.w.take()
	if err != nil {
		return err
	}
	s.pending.merge(wrote)
	cf := Confirm{Events: s.pending.events, Foreign: s.pending.foreign, Force: force, Idle: s.pipe.empty() && idle}
	if s.pending.end != nil {
		cf.Pos = s.pending.end.pos
	}
	done, err := s.rd.Confirm(ctx, cf)
	if err != nil {
		return err
	}
	if done && s.pending.end != nil {
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
