package ordered

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
)

func TestClassify(t *testing.T) {
	refused := errors.New("nacked")
	down := errors.New("connection refused by policy")
	tests := []struct {
		name      string
		err       error
		n         int
		want      []Result
		wantWhole bool
	}{
		{"all accepted", nil, 2, []Result{Accepted, Accepted}, false},
		{"one refused", &broker.BatchError{Errs: []error{nil, refused}}, 2, []Result{Accepted, Rejected}, false},
		{"one without answer", &broker.BatchError{Errs: []error{context.DeadlineExceeded, nil}}, 2, []Result{NoAnswer, Accepted}, false},
		{"one transient", &broker.BatchError{Errs: []error{idem.Transient(refused)}}, 1, []Result{NoAnswer}, false},
		{"whole call failed", down, 2, []Result{NoAnswer, NoAnswer}, true},
		{"whole call refused", broker.Refused(errors.New("HTTP 413")), 2, []Result{Rejected, Rejected}, true},
		{"refused message marked", &broker.BatchError{Errs: []error{broker.Refused(context.DeadlineExceeded)}}, 1, []Result{Rejected}, false},
		{"batch error of another length", &broker.BatchError{Errs: []error{refused}}, 2, []Result{NoAnswer, NoAnswer}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, errs, whole := Classify(tt.err, tt.n)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) || whole != tt.wantWhole {
				t.Fatalf("Classify = %v, whole %v; want %v, whole %v", got, whole, tt.want, tt.wantWhole)
			}
			for i, r := range got {
				if (r == Accepted) != (errs[i] == nil) {
					t.Fatalf("message %d: result %v with error %v", i, r, errs[i])
				}
			}
		})
	}
}

// entries returns n entries for each of keys keys, in interleaved order:
// k0/0, k1/0, ..., k0/1, k1/1...
func entries(keys, n int) []*Entry {
	var es []*Entry
	for j := range n {
		for k := range keys {
			key := fmt.Sprintf("k%d", k)
			es = append(es, &Entry{Key: key, Ref: len(es), Msg: idem.Message{
				EventName: "e", Key: []byte(key), Body: fmt.Appendf(nil, "%s/%d", key, j)}})
		}
	}
	return es
}

func publishTo(pub broker.Publisher) func(ctx context.Context, _ []*Entry, msgs []idem.Message) error {
	return func(ctx context.Context, _ []*Entry, msgs []idem.Message) error { return pub.Publish(ctx, msgs) }
}

// checkOrder fails unless msgs hold, for each key, its messages 0..n-1 in
// order, once each.
func checkOrder(t *testing.T, msgs []idem.Message, keys, n int) {
	t.Helper()
	next := map[string]int{}
	for _, m := range msgs {
		key, num, _ := strings.Cut(string(m.Body), "/")
		if want := fmt.Sprint(next[key]); num != want {
			t.Fatalf("key %s: got message %s, want %s", key, num, want)
		}
		next[key]++
	}
	if len(next) != keys {
		t.Fatalf("%d keys published, want %d", len(next), keys)
	}
	for k, got := range next {
		if got != n {
			t.Fatalf("key %s: %d messages, want %d", k, got, n)
		}
	}
}

func TestPublishesInKeyOrderWithCallsInFlight(t *testing.T) {
	pub := memory.New()
	var mu sync.Mutex
	var twice string
	// The first call holds until the second one starts: it proves two
	// calls in flight at once, without timing.
	second := make(chan struct{})
	pub.SetFunc(func(call int, msgs []idem.Message) memory.Action {
		seen := map[string]bool{}
		mu.Lock()
		for _, m := range msgs {
			if seen[string(m.Key)] {
				twice = string(m.Key)
			}
			seen[string(m.Key)] = true
		}
		mu.Unlock()
		switch call {
		case 1:
			return memory.Action{Hang: second}
		case 2:
			close(second)
		}
		return memory.Action{}
	})
	p := New(context.Background(), Config{Publish: publishTo(pub), Calls: 4, MinCall: 8, MaxCall: 64})
	es := entries(50, 10)
	p.Add(es...)
	p.Wait()
	for _, e := range es {
		if e.Outcome != Published || e.At.IsZero() {
			t.Fatalf("entry %s: outcome %v at %v, want published", e.Msg.Body, e.Outcome, e.At)
		}
	}
	checkOrder(t, pub.Messages(), 50, 10)
	if twice != "" {
		t.Fatalf("two messages of key %s in one call", twice)
	}
}

func TestAddWhilePublishing(t *testing.T) {
	pub := memory.New()
	var settled atomic.Int32
	p := New(context.Background(), Config{Publish: publishTo(pub), Calls: 2, MaxCall: 3, Mode: Retry,
		Backoff: func(int) time.Duration { return time.Millisecond }, Settled: func(*Entry) { settled.Add(1) }})
	es := entries(5, 20)
	for i := 0; i < len(es); i += 7 {
		p.Add(es[i:min(i+7, len(es))]...)
	}
	p.Wait()
	checkOrder(t, pub.Messages(), 5, 20)
	if settled.Load() != int32(len(es)) {
		t.Fatalf("Settled called %d times, want %d", settled.Load(), len(es))
	}
}

func TestGiveBack(t *testing.T) {
	refuse := func(body string) func(idem.Message) error {
		return func(m idem.Message) error {
			if string(m.Body) == body {
				return errors.New("nacked")
			}
			return nil
		}
	}
	tests := []struct {
		name       string
		action     memory.Action
		refusals   int // of every entry before
		quarantine int
		// want is the outcome of each of k0's three entries and of k1's.
		want   [3]Outcome
		wantK1 Outcome
		down   bool
	}{
		{"refused below the limit", memory.Action{Refuse: refuse("k0/1")}, 0, 3,
			[3]Outcome{Published, Refused, Unsent}, Published, false},
		{"refused at the limit", memory.Action{Refuse: refuse("k0/1")}, 2, 3,
			[3]Outcome{Published, Quarantined, Unsent}, Published, false},
		{"never quarantined", memory.Action{Refuse: refuse("k0/0")}, 100, 0,
			[3]Outcome{Refused, Unsent, Unsent}, Published, false},
		{"broker away", memory.Action{Err: errors.New("connection lost")}, 0, 3,
			[3]Outcome{Fault, Unsent, Unsent}, Fault, true},
		{"whole call refused", memory.Action{Err: broker.Refused(errors.New("HTTP 400"))}, 2, 3,
			[3]Outcome{Quarantined, Unsent, Unsent}, Quarantined, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub := memory.New()
			pub.SetFunc(func(int, []idem.Message) memory.Action { return tt.action })
			var downs atomic.Int32
			p := New(context.Background(), Config{Publish: publishTo(pub), Calls: 1, MinCall: 10,
				QuarantineAfter: tt.quarantine, Down: func(error) { downs.Add(1) }})
			es := entries(2, 3)
			for _, e := range es {
				e.Refusals = tt.refusals
			}
			p.Add(es...)
			p.Wait()
			got := [3]Outcome{es[0].Outcome, es[2].Outcome, es[4].Outcome}
			if got != tt.want || es[1].Outcome != tt.wantK1 {
				t.Fatalf("k0: %v, k1: %v; want %v, %v", got, es[1].Outcome, tt.want, tt.wantK1)
			}
			if (downs.Load() > 0) != tt.down || p.Halted() != tt.down {
				t.Fatalf("Down called %d times, halted %v; want down %v", downs.Load(), p.Halted(), tt.down)
			}
			for _, e := range es {
				if (e.Outcome == Published || e.Outcome == Unsent) != (e.Err == nil) {
					t.Fatalf("entry %s: outcome %v with error %v", e.Msg.Body, e.Outcome, e.Err)
				}
			}
		})
	}
}

func TestGiveBackProceed(t *testing.T) {
	pub := memory.New()
	p := New(context.Background(), Config{Publish: publishTo(pub), Calls: 1, MaxCall: 1,
		Proceed: func(started int) bool { return started < 2 }})
	es := entries(4, 1)
	p.Add(es...)
	p.Wait()
	got := []Outcome{es[0].Outcome, es[1].Outcome, es[2].Outcome, es[3].Outcome}
	if fmt.Sprint(got) != fmt.Sprint([]Outcome{Published, Published, Unsent, Unsent}) || !p.Halted() {
		t.Fatalf("outcomes %v, halted %v", got, p.Halted())
	}
}

func TestGiveBackCancelledIsUnsent(t *testing.T) {
	pub := memory.New()
	hang := make(chan struct{})
	defer close(hang)
	pub.SetFunc(func(int, []idem.Message) memory.Action { return memory.Action{Hang: hang} })
	ctx, cancel := context.WithCancel(context.Background())
	var downs atomic.Int32
	p := New(ctx, Config{Publish: publishTo(pub), Calls: 1, Down: func(error) { downs.Add(1) }})
	es := entries(2, 1)
	p.Add(es...)
	if err := pub.Wait(context.Background(), func(_ []idem.Message, inflight int) bool { return inflight == 1 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	p.Wait()
	for _, e := range es {
		if e.Outcome != Unsent {
			t.Fatalf("entry %s: %v, want unsent", e.Msg.Body, e.Outcome)
		}
	}
	if downs.Load() != 0 {
		t.Fatal("a stop counted as a broker failure")
	}
}

func TestRetry(t *testing.T) {
	pub := memory.New()
	var calls atomic.Int32
	// k0/0 is refused on every call; k1/0 meets a fault once.
	pub.SetFunc(func(call int, msgs []idem.Message) memory.Action {
		calls.Add(1)
		return memory.Action{Refuse: func(m idem.Message) error {
			switch {
			case string(m.Body) == "k0/0":
				return errors.New("nacked")
			case string(m.Body) == "k1/0" && call == 1:
				return context.DeadlineExceeded
			}
			return nil
		}}
	})
	var parked []string
	var failed atomic.Int32
	p := New(context.Background(), Config{Publish: publishTo(pub), Calls: 1, MinCall: 10, Mode: Retry, QuarantineAfter: 3,
		Backoff: func(int) time.Duration { return time.Microsecond },
		Park: func(_ context.Context, e *Entry) error {
			parked = append(parked, string(e.Msg.Body))
			return nil
		},
		Failed: func(int, int, error, time.Duration) { failed.Add(1) }})
	es := entries(2, 2)
	p.Add(es...)
	p.Wait()
	if fmt.Sprint(parked) != "[k0/0]" || es[0].Outcome != Quarantined || es[0].Refusals != 3 {
		t.Fatalf("parked %v; k0/0 %v after %d refusals", parked, es[0].Outcome, es[0].Refusals)
	}
	for _, e := range es[1:] {
		if e.Outcome != Published {
			t.Fatalf("entry %s: %v, want published", e.Msg.Body, e.Outcome)
		}
	}
	if es[1].Refusals != 0 {
		t.Fatalf("a fault was counted as a refusal: %d", es[1].Refusals)
	}
	if failed.Load() == 0 {
		t.Fatal("Failed never called")
	}
}

func TestRetryParkFailsPublishesAgain(t *testing.T) {
	pub := memory.New()
	pub.SetFunc(func(int, []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			if string(m.Body) == "k0/0" {
				return errors.New("nacked")
			}
			return nil
		}}
	})
	parks := 0
	p := New(context.Background(), Config{Publish: publishTo(pub), Mode: Retry, QuarantineAfter: 1,
		Backoff: func(int) time.Duration { return time.Microsecond },
		Park: func(context.Context, *Entry) error {
			if parks++; parks < 3 {
				return errors.New("database away")
			}
			return nil
		}})
	es := entries(1, 2)
	p.Add(es...)
	p.Wait()
	if parks != 3 || es[0].Outcome != Quarantined || es[1].Outcome != Published {
		t.Fatalf("parks %d, outcomes %v %v", parks, es[0].Outcome, es[1].Outcome)
	}
}

func TestRetryHalt(t *testing.T) {
	pub := memory.New()
	pub.Fail(errors.New("connection lost"))
	halt := make(chan struct{})
	var once sync.Once
	p := New(context.Background(), Config{Publish: publishTo(pub), Mode: Retry,
		Backoff: func(int) time.Duration { return time.Hour },
		Halt:    halt,
		Failed:  func(int, int, error, time.Duration) { once.Do(func() { close(halt) }) }})
	es := entries(3, 2)
	p.Add(es...)
	p.Wait()
	for _, e := range es {
		if e.Outcome != Unsent {
			t.Fatalf("entry %s: %v, want unsent", e.Msg.Body, e.Outcome)
		}
	}
	if pub.Calls() != 1 {
		t.Fatalf("%d calls after the halt, want 1", pub.Calls())
	}
}
