package batch

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/broker"
)

// Transport is what a Worker needs from its broker, for messages of type T.
type Transport[T any] interface {
	// Key returns the ordering key of m (its aggregate id), or "" when it
	// has none: messages with one key are handled in arrival order, and wait
	// behind an earlier one that waits for a retry.
	Key(m T) string
	// Delivery turns m into what the consumer receives; attempt numbers the
	// deliveries of m to the consumer by this worker, from 1 (a pause does
	// not count).
	Delivery(m T, attempt int) broker.Delivery
	// Ack acknowledges messages that are done.
	Ack(ms []T)
	// Release gives messages back to the broker unhandled, for delivery
	// later: the worker is stopping.
	Release(ms []T)
	// Touch tells the broker that held messages are still being worked on,
	// so that it does not deliver them again meanwhile (JetStream's
	// in-progress acknowledgement). Called every WorkerConfig.TouchEvery.
	Touch(ms []T)
}

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// Deliver is the consumer. Required.
	Deliver broker.DeliverFunc
	// Context is given to Deliver; it ends when in-progress work must be
	// abandoned. Required.
	Context context.Context
	// RequeueDelay is how long a message that could be neither handled nor
	// parked waits before it is delivered again.
	RequeueDelay time.Duration
	// TouchEvery is how often held messages are touched; 0 never.
	TouchEvery time.Duration
	// Logger receives the worker's warnings.
	Logger *slog.Logger
	// OnHeld, when set, is called with the change of the number of messages
	// held, for a subscriber-wide count.
	OnHeld func(delta int)
}

// Worker handles the batches of one dispatch worker (see Dispatch) and keeps
// the order of each key through retries: a message the consumer asks to
// retry is held, unacknowledged, until its delay has passed, and the later
// messages of its key are held behind it and delivered with it, in order,
// while the other keys go on. A pause (the consumer's database or a
// dependency is away) stops the worker taking new batches until its delay
// has passed; the held messages are then delivered again. Nothing held is
// acknowledged: a worker that stops gives its held messages back to the
// broker.
type Worker[T any] struct {
	cfg  WorkerConfig
	tr   Transport[T]
	seq  uint64
	held map[string]*heldKey[T]
	// pauseUntil holds back new batches after a pause.
	pauseUntil time.Time
	nheld      atomic.Int64
}

type entry[T any] struct {
	m       T
	seq     uint64
	attempt int
}

type heldKey[T any] struct {
	entries []*entry[T]
	due     time.Time
}

// NewWorker returns a worker settling messages through tr.
func NewWorker[T any](tr Transport[T], cfg WorkerConfig) *Worker[T] {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Worker[T]{cfg: cfg, tr: tr, held: map[string]*heldKey[T]{}}
}

// Held returns the number of messages the worker holds.
func (w *Worker[T]) Held() int { return int(w.nheld.Load()) }

// Run handles the batches of batches until it is closed or stop is, then
// gives the held messages back to the broker. After stop, it keeps reading
// batches, giving them back unhandled, until batches is closed.
func (w *Worker[T]) Run(batches <-chan []T, stop <-chan struct{}) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var touch <-chan time.Time
	if w.cfg.TouchEvery > 0 {
		t := time.NewTicker(w.cfg.TouchEvery)
		defer t.Stop()
		touch = t.C
	}
	for {
		now := time.Now()
		if due := w.takeDue(now); len(due) > 0 {
			w.deliver(due)
			continue
		}
		in := batches
		wake, ok := w.nextDue()
		if now.Before(w.pauseUntil) {
			in = nil
			if !ok || w.pauseUntil.Before(wake) {
				wake, ok = w.pauseUntil, true
			}
		}
		if ok {
			timer.Reset(max(time.Until(wake), time.Millisecond))
		}
		select {
		case b, open := <-in:
			if !open {
				w.releaseHeld()
				return
			}
			w.accept(b)
		case <-timer.C:
		case <-touch:
			w.touchHeld()
		case <-stop:
			w.releaseHeld()
			for b := range batches {
				w.tr.Release(b)
			}
			return
		}
		if ok && !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// accept delivers a new batch; the messages of held keys join their queues.
func (w *Worker[T]) accept(b []T) {
	ready := make([]*entry[T], 0, len(b))
	for _, m := range b {
		w.seq++
		e := &entry[T]{m: m, seq: w.seq, attempt: 1}
		if h := w.held[w.tr.Key(m)]; h != nil && w.tr.Key(m) != "" {
			h.entries = append(h.entries, e)
			w.addHeld(1)
			continue
		}
		ready = append(ready, e)
	}
	if len(ready) > 0 {
		w.deliver(ready)
	}
}

// takeDue removes the keys whose delay has passed and returns their
// messages in arrival order.
func (w *Worker[T]) takeDue(now time.Time) []*entry[T] {
	var out []*entry[T]
	for k, h := range w.held {
		if !h.due.After(now) {
			out = append(out, h.entries...)
			delete(w.held, k)
		}
	}
	w.addHeld(-len(out))
	slices.SortFunc(out, func(a, b *entry[T]) int { return compareSeq(a.seq, b.seq) })
	return out
}

func compareSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (w *Worker[T]) nextDue() (time.Time, bool) {
	var next time.Time
	ok := false
	for _, h := range w.held {
		if !ok || h.due.Before(next) {
			next, ok = h.due, true
		}
	}
	return next, ok
}

// deliver gives entries to the consumer and settles each: acknowledged, or
// held with its key.
func (w *Worker[T]) deliver(entries []*entry[T]) {
	ds := make([]broker.Delivery, len(entries))
	for i, e := range entries {
		ds[i] = w.tr.Delivery(e.m, e.attempt)
	}
	stopTouch := w.touchWhile(entries)
	disps, errs := w.cfg.Deliver(w.cfg.Context, ds)
	stopTouch()
	now := time.Now()
	acks := make([]T, 0, len(entries))
	// Keys that began waiting in this call: their later messages join them.
	waiting := map[string]bool{}
	for i, e := range entries {
		var (
			d   broker.Disposition
			err error
		)
		if i < len(disps) {
			d = disps[i]
		}
		if i < len(errs) {
			err = errs[i]
		}
		if i >= len(disps) || i >= len(errs) {
			err = errors.New("no disposition for the message")
		}
		k := w.tr.Key(e.m)
		if k != "" && waiting[k] {
			if err == nil && d.Action == broker.Ack {
				acks = append(acks, e.m)
				continue
			}
			if err == nil && d.Action == broker.Retry && d.Outcome != broker.Deferred {
				e.attempt++
			}
			w.hold(k, e, time.Time{})
			continue
		}
		var due time.Time
		switch {
		case err != nil:
			w.cfg.Logger.Error("message neither handled nor parked; delivering it again later",
				"event_id", ds[i].Message.EventID, "error", err)
			due = now.Add(w.cfg.RequeueDelay)
		case d.Action == broker.Ack:
			acks = append(acks, e.m)
			continue
		case d.Action == broker.Retry:
			if d.Outcome != broker.Deferred {
				e.attempt++
			}
			due = now.Add(d.RetryAfter)
		case d.Action == broker.Pause:
			due = now.Add(d.RetryAfter)
			if due.After(w.pauseUntil) {
				w.pauseUntil = due
			}
		default:
			w.cfg.Logger.Error("unknown disposition; delivering the message again later", "action", d.Action)
			due = now.Add(w.cfg.RequeueDelay)
		}
		if k == "" {
			// No key: nothing waits behind it; hold it alone.
			k = uniqueKey(e.seq)
		} else {
			waiting[k] = true
		}
		w.hold(k, e, due)
	}
	if len(acks) > 0 {
		w.tr.Ack(acks)
	}
}

// uniqueKey is the hold key of a message without a key.
func uniqueKey(seq uint64) string {
	b := make([]byte, 9)
	for i := range 8 {
		b[i+1] = byte(seq >> (8 * i))
	}
	return string(b)
}

// hold adds e to the queue of key k; a new queue is due at due, an existing
// one keeps its time.
func (w *Worker[T]) hold(k string, e *entry[T], due time.Time) {
	h := w.held[k]
	if h == nil {
		h = &heldKey[T]{due: due}
		w.held[k] = h
	}
	h.entries = append(h.entries, e)
	w.addHeld(1)
}

func (w *Worker[T]) all() []T {
	var ms []T
	var es []*entry[T]
	for _, h := range w.held {
		es = append(es, h.entries...)
	}
	slices.SortFunc(es, func(a, b *entry[T]) int { return compareSeq(a.seq, b.seq) })
	for _, e := range es {
		ms = append(ms, e.m)
	}
	return ms
}

// touchWhile touches entries and the held messages every TouchEvery until
// the returned function is called: a delivery can outlast the broker's
// redelivery timeout.
func (w *Worker[T]) touchWhile(entries []*entry[T]) func() {
	if w.cfg.TouchEvery <= 0 {
		return func() {}
	}
	ms := w.all()
	for _, e := range entries {
		ms = append(ms, e.m)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(w.cfg.TouchEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				w.tr.Touch(ms)
			}
		}
	}()
	return func() { close(stop); <-done }
}

func (w *Worker[T]) touchHeld() {
	if ms := w.all(); len(ms) > 0 {
		w.tr.Touch(ms)
	}
}

func (w *Worker[T]) releaseHeld() {
	if ms := w.all(); len(ms) > 0 {
		w.tr.Release(ms)
	}
	clear(w.held)
	w.addHeld(-w.Held())
}

func (w *Worker[T]) addHeld(n int) {
	if n == 0 {
		return
	}
	w.nheld.Add(int64(n))
	if w.cfg.OnHeld != nil {
		w.cfg.OnHeld(n)
	}
}
