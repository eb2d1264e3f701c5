package batch_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/internal/batch"
)

// msg is a message of the fake transport: a name ("a1") and a key ("a"),
// "" for none.
type msg struct{ key, name string }

func m(key, name string) msg { return msg{key: key, name: name} }

// fakeTransport records what the worker asks of it, one line per call with
// the time elapsed in the bubble: "2s ack a1 a2".
type fakeTransport struct {
	start time.Time
	mu    sync.Mutex
	log   []string
}

func (f *fakeTransport) Key(m msg) string { return m.key }
func (f *fakeTransport) Delivery(m msg, attempt int) broker.Delivery {
	return broker.Delivery{Message: idem.Message{EventName: m.name, Key: []byte(m.key)}, Attempt: attempt}
}
func (f *fakeTransport) Ack(ms []msg)     { f.record("ack", names(ms)) }
func (f *fakeTransport) Release(ms []msg) { f.record("release", names(ms)) }
func (f *fakeTransport) Touch(ms []msg)   { f.record("touch", names(ms)) }

func (f *fakeTransport) record(op string, what []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, fmt.Sprintf("%v %s %s", time.Since(f.start), op, strings.Join(what, " ")))
}

func (f *fakeTransport) lines() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.log)
}

func names(ms []msg) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.name
	}
	return out
}

// answer turns a scripted answer into the consumer's verdict: "" or "ack",
// "retry 2s" (a failed attempt), "defer 2s" (behind an earlier message of
// its key), "pause 5s", "error" (neither handled nor parked), "unknown" (an
// action the worker does not know), "slow 2500ms" (acknowledged after that
// long), "drop" (no disposition for it nor for what follows in its call).
func answer(s string) (d broker.Disposition, wait time.Duration, err error) {
	verb, arg, _ := strings.Cut(s, " ")
	after, _ := time.ParseDuration(arg)
	switch verb {
	case "", "ack":
		return broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}, 0, nil
	case "retry":
		return broker.Disposition{Action: broker.Retry, Outcome: broker.Failed, RetryAfter: after}, 0, nil
	case "defer":
		return broker.Disposition{Action: broker.Retry, Outcome: broker.Deferred, RetryAfter: after}, 0, nil
	case "pause":
		return broker.Disposition{Action: broker.Pause, Outcome: broker.Paused, RetryAfter: after}, 0, nil
	case "error":
		return broker.Disposition{}, 0, errors.New("database away")
	case "unknown":
		return broker.Disposition{Action: broker.Action(99)}, 0, nil
	case "slow":
		return broker.Disposition{Action: broker.Ack, Outcome: broker.Applied}, after, nil
	}
	panic("unknown answer " + s)
}

// step sends batch to the worker at time at.
type step struct {
	at    time.Duration
	batch []msg
}

func TestWorker(t *testing.T) {
	const requeue = 3 * time.Second
	tests := []struct {
		name string
		// steps send batches, in order, at their times.
		steps []step
		// answers, by "name/attempt", each given once; acknowledged when
		// missing or already given.
		answers map[string]string
		// touch is WorkerConfig.TouchEvery.
		touch time.Duration
		// end is when the worker is stopped (stop true) or its batches
		// closed.
		end  time.Duration
		stop bool
		// after are batches sent once stop is closed.
		after [][]msg
		want  []string
	}{{
		name:  "every message acknowledged at once",
		steps: []step{{0, []msg{m("a", "a1"), m("b", "b1"), m("a", "a2")}}},
		end:   time.Second,
		want:  []string{"0s deliver a1/1 b1/1 a2/1", "0s ack a1 b1 a2"},
	}, {
		name:    "a retry holds its key and the later messages of its key, other keys go on",
		steps:   []step{{0, []msg{m("a", "a1"), m("b", "b1"), m("a", "a2")}}},
		answers: map[string]string{"a1/1": "retry 2s", "a2/1": "defer 2s"},
		end:     5 * time.Second,
		want: []string{
			"0s deliver a1/1 b1/1 a2/1", "0s ack b1",
			"2s deliver a1/2 a2/1", "2s ack a1 a2",
		},
	}, {
		name: "a later batch's message of a held key joins it, undelivered until the key is due",
		steps: []step{
			{0, []msg{m("a", "a1")}},
			{time.Second, []msg{m("a", "a2"), m("b", "b1")}},
		},
		answers: map[string]string{"a1/1": "retry 2s"},
		end:     5 * time.Second,
		want: []string{
			"0s deliver a1/1",
			"1s deliver b1/1", "1s ack b1",
			"2s deliver a1/2 a2/1", "2s ack a1 a2",
		},
	}, {
		name:    "a deferred message costs no attempt",
		steps:   []step{{0, []msg{m("a", "a1")}}},
		answers: map[string]string{"a1/1": "defer 1s"},
		end:     5 * time.Second,
		want:    []string{"0s deliver a1/1", "1s deliver a1/1", "1s ack a1"},
	}, {
		name:    "a failed retry of a later message behind a waiting key counts an attempt and waits with the key",
		steps:   []step{{0, []msg{m("a", "a1"), m("a", "a2")}}},
		answers: map[string]string{"a1/1": "retry 1s", "a2/1": "retry 9s"},
		end:     5 * time.Second,
		want:    []string{"0s deliver a1/1 a2/1", "1s deliver a1/2 a2/2", "1s ack a1 a2"},
	}, {
		name:    "a later message acknowledged while its key waits is acknowledged",
		steps:   []step{{0, []msg{m("a", "a1"), m("a", "a2")}}},
		answers: map[string]string{"a1/1": "retry 1s"},
		end:     5 * time.Second,
		want:    []string{"0s deliver a1/1 a2/1", "0s ack a2", "1s deliver a1/2", "1s ack a1"},
	}, {
		name:    "retries of several keys are due each at its time, in arrival order when due together",
		steps:   []step{{0, []msg{m("a", "a1"), m("b", "b1"), m("c", "c1")}}},
		answers: map[string]string{"a1/1": "retry 2s", "b1/1": "retry 1s", "c1/1": "retry 2s"},
		end:     5 * time.Second,
		want: []string{
			"0s deliver a1/1 b1/1 c1/1",
			"1s deliver b1/2", "1s ack b1",
			"2s deliver a1/2 c1/2", "2s ack a1 c1",
		},
	}, {
		name: "messages without a key wait alone",
		steps: []step{
			{0, []msg{m("", "x1"), m("", "x2")}},
			{500 * time.Millisecond, []msg{m("", "x3")}},
		},
		answers: map[string]string{"x1/1": "retry 1s"},
		end:     5 * time.Second,
		want: []string{
			"0s deliver x1/1 x2/1", "0s ack x2",
			"500ms deliver x3/1", "500ms ack x3",
			"1s deliver x1/2", "1s ack x1",
		},
	}, {
		name: "a pause takes no new batch until its end, then delivers the message again at no attempt's cost",
		steps: []step{
			{0, []msg{m("a", "a1"), m("b", "b1")}},
			{time.Second, []msg{m("c", "c1")}},
		},
		answers: map[string]string{"a1/1": "pause 5s"},
		end:     8 * time.Second,
		want: []string{
			"0s deliver a1/1 b1/1", "0s ack b1",
			"5s deliver a1/1", "5s ack a1",
			"5s deliver c1/1", "5s ack c1",
		},
	}, {
		name: "a pause ends at its time though a retry is due later",
		steps: []step{
			{0, []msg{m("a", "a1"), m("b", "b1")}},
			{time.Second, []msg{m("c", "c1")}},
		},
		answers: map[string]string{"a1/1": "retry 6s", "b1/1": "pause 2s"},
		end:     8 * time.Second,
		want: []string{
			"0s deliver a1/1 b1/1",
			"2s deliver b1/1", "2s ack b1",
			"2s deliver c1/1", "2s ack c1",
			"6s deliver a1/2", "6s ack a1",
		},
	}, {
		name:    "the longest of two pauses holds the batches back",
		steps:   []step{{0, []msg{m("a", "a1"), m("b", "b1")}}, {time.Second, []msg{m("c", "c1")}}},
		answers: map[string]string{"a1/1": "pause 4s", "b1/1": "pause 2s"},
		end:     8 * time.Second,
		want: []string{
			"0s deliver a1/1 b1/1",
			"2s deliver b1/1", "2s ack b1",
			"4s deliver a1/1", "4s ack a1",
			"4s deliver c1/1", "4s ack c1",
		},
	}, {
		name:    "a message neither handled nor parked comes again after RequeueDelay, at no attempt's cost",
		steps:   []step{{0, []msg{m("a", "a1"), m("a", "a2"), m("b", "b1")}}},
		answers: map[string]string{"a1/1": "error"},
		end:     5 * time.Second,
		want: []string{
			"0s deliver a1/1 a2/1 b1/1", "0s ack a2 b1",
			"3s deliver a1/1", "3s ack a1",
		},
	}, {
		name:    "an action the worker does not know comes again after RequeueDelay",
		steps:   []step{{0, []msg{m("a", "a1")}}},
		answers: map[string]string{"a1/1": "unknown"},
		end:     5 * time.Second,
		want:    []string{"0s deliver a1/1", "3s deliver a1/1", "3s ack a1"},
	}, {
		name:    "messages the consumer gave no disposition for come again after RequeueDelay",
		steps:   []step{{0, []msg{m("a", "a1"), m("b", "b1"), m("c", "c1")}}},
		answers: map[string]string{"b1/1": "drop"},
		end:     5 * time.Second,
		want: []string{
			"0s deliver a1/1 b1/1 c1/1", "0s ack a1",
			"3s deliver b1/1 c1/1", "3s ack b1 c1",
		},
	}, {
		name:    "stopping gives the held messages back, in arrival order, then every batch still sent",
		steps:   []step{{0, []msg{m("a", "a1"), m("b", "b1"), m("a", "a2"), m("c", "c1")}}},
		answers: map[string]string{"a1/1": "retry 10s", "a2/1": "defer 10s", "b1/1": "retry 20s"},
		end:     2 * time.Second,
		stop:    true,
		after:   [][]msg{{m("d", "d1")}, {m("a", "a3")}},
		want: []string{
			"0s deliver a1/1 b1/1 a2/1 c1/1", "0s ack c1",
			"2s release a1 b1 a2",
			"2s release d1",
			"2s release a3",
		},
	}, {
		name:    "closing the batches gives the held messages back",
		steps:   []step{{0, []msg{m("a", "a1"), m("b", "b1")}}},
		answers: map[string]string{"a1/1": "retry 10s"},
		end:     2 * time.Second,
		want:    []string{"0s deliver a1/1 b1/1", "0s ack b1", "2s release a1"},
	}, {
		name:    "a paused worker stopped gives the paused message back",
		steps:   []step{{0, []msg{m("a", "a1")}}},
		answers: map[string]string{"a1/1": "pause 10s"},
		end:     2 * time.Second,
		stop:    true,
		want:    []string{"0s deliver a1/1", "2s release a1"},
	}, {
		name:    "held messages are touched every TouchEvery until due",
		steps:   []step{{0, []msg{m("a", "a1"), m("b", "b1")}}},
		answers: map[string]string{"a1/1": "retry 2500ms"},
		touch:   time.Second,
		end:     4500 * time.Millisecond,
		want: []string{
			"0s deliver a1/1 b1/1", "0s ack b1",
			"1s touch a1", "2s touch a1",
			"2.5s deliver a1/2", "2.5s ack a1",
		},
	}, {
		name: "a long delivery touches its messages and the held ones",
		steps: []step{
			{0, []msg{m("a", "a1")}},
			{500 * time.Millisecond, []msg{m("b", "b1")}},
		},
		answers: map[string]string{"a1/1": "retry 10s", "b1/1": "slow 2200ms"},
		touch:   time.Second,
		end:     2900 * time.Millisecond,
		want: []string{
			"0s deliver a1/1",
			"500ms deliver b1/1",
			"1.5s touch a1 b1", "2.5s touch a1 b1",
			"2.7s ack b1",
			"2.7s touch a1", // the worker's own tick, missed during the delivery
			"2.9s release a1",
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := &fakeTransport{start: time.Now()}
				var heldDelta int
				var mu sync.Mutex
				used := map[string]bool{}
				w := batch.NewWorker[msg](tr, batch.WorkerConfig{
					Deliver: func(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
						var call []string
						for _, d := range ds {
							call = append(call, fmt.Sprintf("%s/%d", d.Message.EventName, d.Attempt))
						}
						tr.record("deliver", call)
						disps, errs := make([]broker.Disposition, 0, len(ds)), make([]error, 0, len(ds))
						var wait time.Duration
						for _, c := range call {
							a := tt.answers[c]
							if used[c] {
								a = ""
							}
							used[c] = true
							if a == "drop" {
								break
							}
							d, w, err := answer(a)
							disps, errs, wait = append(disps, d), append(errs, err), max(wait, w)
						}
						time.Sleep(wait)
						return disps, errs
					},
					Context:      t.Context(),
					RequeueDelay: requeue,
					TouchEvery:   tt.touch,
					Logger:       slog.New(slog.DiscardHandler),
					OnHeld: func(delta int) {
						mu.Lock()
						heldDelta += delta
						mu.Unlock()
					},
				})
				batches, stop, done := make(chan []msg), make(chan struct{}), make(chan struct{})
				go func() {
					defer close(done)
					w.Run(batches, stop)
				}()
				start := time.Now()
				for _, s := range tt.steps {
					time.Sleep(s.at - time.Since(start))
					batches <- s.batch
				}
				time.Sleep(tt.end - time.Since(start))
				if tt.stop {
					close(stop)
					// The worker takes the stop before any later batch.
					synctest.Wait()
					for _, b := range tt.after {
						batches <- b
					}
				}
				close(batches)
				<-done
				if got := tr.lines(); !slices.Equal(got, tt.want) {
					t.Errorf("got\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(tt.want, "\n\t"))
				}
				mu.Lock()
				defer mu.Unlock()
				if w.Held() != 0 || heldDelta != 0 {
					t.Errorf("after Run: Held() = %d, sum of OnHeld = %d; want 0 and 0", w.Held(), heldDelta)
				}
			})
		})
	}
}

// Held and OnHeld follow the messages held, the later messages of a held key
// included.
func TestWorkerHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &fakeTransport{start: time.Now()}
		var delta int
		var mu sync.Mutex
		w := batch.NewWorker[msg](tr, batch.WorkerConfig{
			Deliver: func(_ context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
				disps := make([]broker.Disposition, len(ds))
				for i, d := range ds {
					disps[i], _, _ = answer("ack")
					if d.Message.EventName == "a1" && d.Attempt == 1 {
						disps[i], _, _ = answer("retry 10s")
					}
				}
				return disps, make([]error, len(ds))
			},
			Context: t.Context(),
			Logger:  slog.New(slog.DiscardHandler),
			OnHeld: func(d int) {
				mu.Lock()
				delta += d
				mu.Unlock()
			},
		})
		batches := make(chan []msg)
		done := make(chan struct{})
		go func() {
			defer close(done)
			w.Run(batches, nil)
		}()
		check := func(want int) {
			t.Helper()
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			if w.Held() != want || delta != want {
				t.Errorf("Held() = %d, sum of OnHeld = %d; want %d", w.Held(), delta, want)
			}
		}
		batches <- []msg{m("a", "a1"), m("b", "b1")}
		check(1)
		batches <- []msg{m("a", "a2"), m("a", "a3"), m("c", "c1")}
		check(3)
		time.Sleep(11 * time.Second)
		check(0)
		close(batches)
		<-done
	})
}

// TestDispatch: a worker's batch goes when it holds size items or when its
// first item has waited linger, each worker on its own clock; closing the
// input sends what is pending.
func TestDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		in := make(chan msg)
		var mu sync.Mutex
		got := map[int][]string{}
		done := make(chan struct{})
		go func() {
			defer close(done)
			batch.Dispatch(in, 2, 3, time.Second,
				func(m msg) int {
					if m.key == "a" {
						return 0
					}
					return 1
				},
				func(worker int, batches <-chan []msg) {
					for b := range batches {
						mu.Lock()
						got[worker] = append(got[worker], fmt.Sprintf("%v %s", time.Since(start), strings.Join(names(b), " ")))
						mu.Unlock()
					}
					mu.Lock()
					got[worker] = append(got[worker], fmt.Sprintf("%v closed", time.Since(start)))
					mu.Unlock()
				})
		}()
		send := func(at time.Duration, ms ...msg) {
			time.Sleep(at - time.Since(start))
			for _, m := range ms {
				in <- m
			}
		}
		send(0, m("a", "a1"), m("b", "b1"), m("a", "a2"), m("a", "a3")) // a: full at once
		send(200*time.Millisecond, m("a", "a4"))                        // b lingers from 0s, a from 200ms
		send(1500*time.Millisecond, m("b", "b2"), m("b", "b3"))
		send(1700*time.Millisecond, m("a", "a5"))
		close(in)
		<-done
		want := map[int][]string{
			0: {"0s a1 a2 a3", "1.2s a4", "1.7s a5", "1.7s closed"},
			1: {"1s b1", "1.7s b2 b3", "1.7s closed"},
		}
		for w := range 2 {
			if !slices.Equal(got[w], want[w]) {
				t.Errorf("worker %d got %q, want %q", w, got[w], want[w])
			}
		}
	})
}
