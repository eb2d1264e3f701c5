package logengine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem/internal/ctxsleep"
)

// writer deletes the published rows and archives their events in a
// goroutine of its own, beside the reading: the log is read, and the
// broker fed, while a statement runs. The reader hands it what the broker
// confirmed, in log order (add), and confirms the positions it wrote
// (take): a position is made durable only once the rows before it are
// deleted and their events archived.
type writer struct {
	r        *Relay
	wake     chan struct{}
	progress chan struct{} // a write ended: the reader may go on

	mu      sync.Mutex
	queue   confirmed // handed, not written yet
	writing bool      // a write is running
	wrote   confirmed // written, not taken yet
	failing bool      // the last write failed: it is retried after a backoff
	err     error     // the server is going away: the session ends
}

// writerBacklog is how many Windows of confirmed rows the writer may hold
// before the reader waits for it: a database that is slow or away holds
// the reading, not the memory.
const writerBacklog = 4

func newWriter(r *Relay) *writer {
	return &writer{r: r, wake: make(chan struct{}, 1), progress: make(chan struct{}, 1)}
}

// add queues c to be written.
func (w *writer) add(c confirmed) {
	if c.end == nil && len(c.ids) == 0 && len(c.archive) == 0 {
		return
	}
	w.mu.Lock()
	w.queue.merge(c)
	w.mu.Unlock()
	signal(w.wake)
}

// full reports whether the writer holds so much that the reader waits.
func (w *writer) full() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return max(len(w.queue.ids), len(w.queue.archive)) >= writerBacklog*w.r.cfg.Window
}

// take returns what was written since the last take, whether nothing
// waits to be written, and the error that ends the session, if any.
func (w *writer) take() (confirmed, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.wrote
	w.wrote = confirmed{}
	return c, !w.writing && w.queue.empty(), w.err
}

// waitIdle waits until everything added is written, the writes fail (the
// database is away: what is written is confirmed, the rest is read again
// by the next session), or the session's error; false when ctx ends
// first.
func (w *writer) waitIdle(ctx context.Context) bool {
	for {
		w.mu.Lock()
		done := w.err != nil || w.failing || (!w.writing && w.queue.empty())
		w.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-w.progress:
		case <-ctx.Done():
			return false
		}
	}
}

// run writes what is added until ctx ends.
func (w *writer) run(ctx context.Context) {
	r := w.r
	failures := 0
	for {
		select {
		case <-w.wake:
		case <-ctx.Done():
			return
		}
		for {
			w.mu.Lock()
			c := w.queue
			w.queue = confirmed{}
			w.writing = !c.empty()
			w.mu.Unlock()
			if c.empty() {
				break
			}
			for {
				err := w.write(ctx, &c)
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return
				}
				if r.src.Gone(err) {
					// A server shutting down may wait for what it sent to
					// be confirmed, and refuse the deletes the position
					// waits for: leave, and resume from the durable
					// position.
					w.mu.Lock()
					w.err = fmt.Errorf("idem: %s: delete published rows: %w", r.cfg.Name, err)
					w.mu.Unlock()
					signal(w.progress)
					return
				}
				failures++
				w.mu.Lock()
				w.failing = true
				w.mu.Unlock()
				signal(w.progress)
				d := r.Backoff(failures)
				r.errs.delete.Warn(ctx, "deleting published rows failed; their position waits", err,
					"rows", len(c.ids), "retry_in", d.Round(time.Millisecond))
				if !ctxsleep.Sleep(ctx, d) {
					return
				}
			}
			failures = 0
			r.errs.delete.OK(ctx)
			w.mu.Lock()
			w.wrote.merge(c)
			w.writing, w.failing = false, false
			w.mu.Unlock()
			signal(w.progress)
		}
	}
}

// write deletes c's rows and archives its events, a statement (or
// transaction) per 1,000 of each: deleted and archived together, or
// neither. What is written leaves c: a failure keeps the rest.
func (w *writer) write(ctx context.Context, c *confirmed) error {
	r := w.r
	for len(c.ids) > 0 || len(c.archive) > 0 {
		n, m := min(len(c.ids), writeChunk), min(len(c.archive), writeChunk)
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		deleted, archived, err := r.src.Delete(qctx, c.ids[:n], c.archive[:m])
		cancel()
		if err != nil {
			return err
		}
		r.C.Deleted.Add(deleted)
		r.C.Archived.Add(archived)
		c.ids, c.archive = c.ids[n:], c.archive[m:]
	}
	return nil
}

// merge appends d, which follows c in the log, to c.
func (c *confirmed) merge(d confirmed) {
	c.ids = append(c.ids, d.ids...)
	c.archive = append(c.archive, d.archive...)
	if d.end != nil {
		c.end = d.end
	}
	c.commits = append(c.commits, d.commits...)
	c.events = c.events || d.events
	c.foreign = c.foreign || d.foreign
}

// empty reports whether c holds nothing to write nor position.
func (c *confirmed) empty() bool {
	return c.end == nil && len(c.ids) == 0 && len(c.archive) == 0
}

// signal wakes the one waiting on ch, if any, without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// writeChunk is the most rows deleted, and events archived, per statement
// (or transaction): 4,000 drained no faster than 1,000.
const writeChunk = 1000
