package brokertest

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/inbox"
)

// consumerWith returns an EffectConsumer configured by cfg.
func (b *bundle) consumerWith(t *testing.T, cfg inbox.Config, fail func(idem.Event) error) *inbox.Consumer[pgx.Tx] {
	t.Helper()
	c := EffectConsumer(t, b.pg.Driver, cfg, fail)
	b.mu.Lock()
	b.consumers, b.names = append(b.consumers, c), append(b.names, cfg.Name)
	b.mu.Unlock()
	return c
}

// waiting returns what waits in the broker for consumer, delivered and
// unacknowledged included: the Inspector's figure where the publisher is
// one, else the instance's Backlog.
func (b *bundle) waiting(t *testing.T, consumer string) int {
	t.Helper()
	in, ok := b.inst.Publisher.(broker.Inspector)
	if !ok {
		return b.inst.Backlog(t, consumer)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	qs, err := in.Inspect(ctx, []string{consumer})
	if err != nil {
		t.Fatalf("inspect %s: %v", consumer, err)
	}
	var n int64
	for _, q := range qs {
		n += max(q.Waiting(), 0)
	}
	return int(n)
}

// answers records, per event, the actions a consumer answered.
type answers struct {
	mu sync.Mutex
	m  map[uuid.UUID][]broker.Disposition
}

func (a *answers) wrap(next broker.DeliverFunc) broker.DeliverFunc {
	return func(ctx context.Context, ds []broker.Delivery) ([]broker.Disposition, []error) {
		disps, errs := next(ctx, ds)
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.m == nil {
			a.m = map[uuid.UUID][]broker.Disposition{}
		}
		for i, d := range ds {
			a.m[d.Message.EventID] = append(a.m[d.Message.EventID], disps[i])
		}
		return disps, errs
	}
}

// handedBack returns how many messages of msgs were answered Pause,
// Outcome Paused, at least once.
func (a *answers) handedBack(msgs []idem.Message) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, m := range msgs {
		if slices.ContainsFunc(a.m[m.EventID], func(d broker.Disposition) bool {
			return d.Action == broker.Pause && d.Outcome == broker.Paused
		}) {
			n++
		}
	}
	return n
}

// testOperatorPause: a consumer paused by an operator (inbox.PauseStore)
// mid-stream hands every message back to the transport before its handler
// runs, counting no attempt and parking nothing, while the messages wait in
// the broker; once resumed, it applies them all, once each, in order. The
// pause is read on the consumer's clock, which the test moves past
// PauseCheck: the pause takes effect at the next delivery, on every
// transport, with no wait.
func testOperatorPause(t *testing.T, tr Transport) {
	name := "test.parcel.shipped.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"shipping"}})
	clock := idemtest.NewClock()
	const check = 200 * time.Millisecond
	var calls atomic.Int64
	c := b.consumerWith(t, inbox.Config{Name: "shipping", Retry: fastRetry, PauseCheck: check, Now: clock.Now},
		func(idem.Event) error { calls.Add(1); return nil })
	ans := &answers{}
	start(t, b.inst.NewSubscriber(t, "shipping", ans.wrap(c.DeliverBatch)))

	var before, during []idem.Message
	for i := range 4 {
		before = append(before, NewMessage(t, name, "k"+strconv.Itoa(i%2), i))
	}
	Publish(t, b.inst.Publisher, before...)
	b.waitFor(t, "the first messages applied", func() bool { return c.Stats().Applied == uint64(len(before)) })

	ctx := context.Background()
	if err := c.Pauses().Pause(ctx, "shipping", idem.Pause{Reason: "carrier maintenance", By: "test"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(check) // the next delivery reads the pause
	for i := range 6 {
		during = append(during, NewMessage(t, name, "k"+strconv.Itoa(i%3), 10+i))
	}
	Publish(t, b.inst.Publisher, during...)
	// The barrier: every message published during the pause was delivered
	// and handed back; or, where the transport fetches nothing more while
	// its consumer pauses (Kafka), those it had fetched were, and all of
	// them wait in the broker. The handler count is read after that.
	b.waitFor(t, "messages handed back while paused", func() bool {
		if n := calls.Load(); n > int64(len(before)) {
			t.Fatalf("handler called %d times after the pause, want %d (the messages before it only)", n, len(before))
		}
		n := ans.handedBack(during)
		return n == len(during) || (n > 0 && b.waiting(t, "shipping") == len(during))
	})
	if n := calls.Load(); n != int64(len(before)) {
		t.Fatalf("handler called %d times while paused, want %d (the messages before the pause only)", n, len(before))
	}
	st := c.Stats()
	if st.OperatorPaused == 0 || st.OperatorPause.Reason != "carrier maintenance" {
		t.Errorf("stats while paused: %+v; want OperatorPaused > 0 and the pause's reason", st)
	}
	if n := b.pg.Count(t, "delivery_attempt"); n != 0 {
		t.Errorf("delivery_attempt rows while paused: %d, want 0", n)
	}

	ok, err := c.Pauses().Resume(ctx, "shipping")
	if err != nil || !ok {
		t.Fatalf("Resume = %v, %v; want true, nil", ok, err)
	}
	clock.Advance(check)
	all := append(slices.Clone(before), during...)
	b.waitFor(t, "every message applied after the resume", func() bool { return c.Stats().Applied == uint64(len(all)) })
	b.drained(t, "shipping")
	CheckOnceInOrder(t, b.pg, "shipping", all)
	if n := b.pg.Count(t, "delivery_attempt"); n != 0 {
		t.Errorf("delivery_attempt rows: %d, want 0: a pause counts no attempt", n)
	}
	if n := b.pg.Count(t, "failed_message"); n != 0 {
		t.Errorf("failed_message rows: %d, want 0: a pause parks nothing", n)
	}
	// Delivery.Attempt counts deliveries on some transports, for
	// information: what counts is the consumer's answers, which were
	// hand-backs, then one application.
	ans.mu.Lock()
	for _, m := range during {
		for _, d := range ans.m[m.EventID] {
			if !(d.Action == broker.Pause && d.Outcome == broker.Paused) && !(d.Action == broker.Ack && d.Outcome == broker.Applied) {
				t.Errorf("message %s answered %v/%v; want only hand-backs (pause/paused), then ack/applied", m.EventID, d.Action, d.Outcome)
			}
		}
	}
	ans.mu.Unlock()
	if calls.Load() != int64(len(all)) {
		t.Errorf("handler called %d times, want %d", calls.Load(), len(all))
	}
}

// testRateLimit: a consumer with a rate limit (inbox.Config.RateLimit)
// applies a backlog no faster than its token bucket allows, and one with a
// per-key limit (KeyLimit) no faster per key, handing back what would wait
// longer than RateWaitMax; neither counts an attempt or parks anything, and
// each applies every message once, in order per key. The check is the
// token bucket's invariant on the times the handler recorded: in every
// window between two of them, the events applied number at most the burst
// plus the rate times the window widened by the most a handler starts
// after the limiter let its event through (bucketJitter).
func testRateLimit(t *testing.T, tr Transport) {
	name := "test.invoice.issued.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"stock", "billing"}})
	type rec struct {
		mu    sync.Mutex
		times map[string][]time.Time // by key, "" for all
	}
	record := func(r *rec) func(idem.Event) error {
		r.times = map[string][]time.Time{}
		return func(ev idem.Event) error {
			now := time.Now()
			r.mu.Lock()
			r.times[""] = append(r.times[""], now)
			r.times[ev.AggregateID] = append(r.times[ev.AggregateID], now)
			r.mu.Unlock()
			return nil
		}
	}
	const (
		rate, burst       = 20.0, 2
		keyRate, keyBurst = 4.0, 1
	)
	var all, perKey rec
	stock := b.consumerWith(t, inbox.Config{Name: "stock", Retry: fastRetry, RateLimit: rate, RateBurst: burst}, record(&all))
	billing := b.consumerWith(t, inbox.Config{Name: "billing", Retry: fastRetry, KeyLimit: keyRate, KeyBurst: keyBurst,
		RateWaitMax: 20 * time.Millisecond}, record(&perKey))
	b.subscribe(t, "stock", stock)
	b.subscribe(t, "billing", billing)

	var msgs []idem.Message
	for i := range 24 {
		msgs = append(msgs, NewMessage(t, name, "k"+strconv.Itoa(i%4), i))
	}
	Publish(t, b.inst.Publisher, msgs...)
	b.waitFor(t, "every message applied by both", func() bool {
		return stock.Stats().Applied == uint64(len(msgs)) && billing.Stats().Applied == uint64(len(msgs))
	})
	checkBucket(t, "stock", all.times[""], rate, burst)
	for k := range 4 {
		key := "k" + strconv.Itoa(k)
		checkBucket(t, "billing key "+key, perKey.times[key], keyRate, keyBurst)
	}
	if st := billing.Stats(); st.RateLimited == 0 {
		t.Errorf("billing stats %+v: want RateLimited > 0 (a RateWaitMax of 20ms under 4/s per key hands messages back)", st)
	}
	if st := stock.Stats(); st.RateWait == 0 {
		t.Errorf("stock stats %+v: want RateWait > 0", st)
	}
	for _, c := range []string{"stock", "billing"} {
		b.drained(t, c)
		CheckOnceInOrder(t, b.pg, c, msgs)
	}
	if n := b.pg.Count(t, "delivery_attempt"); n != 0 {
		t.Errorf("delivery_attempt rows: %d, want 0: waiting for a limit counts no attempt", n)
	}
	if n := b.pg.Count(t, "failed_message"); n != 0 {
		t.Errorf("failed_message rows: %d, want 0: waiting for a limit parks nothing", n)
	}
}

// bucketJitter bounds the time from the limiter's grant to the handler's
// start (a transaction's begin, a marker's insert), on a busy 2-core
// machine: an event the limiter let through at A is recorded in
// [A, A+bucketJitter], so the recorded times of a window W hold the grants
// of a window of at most W+bucketJitter. 100ms was exceeded under the
// whole suite's load (two grants 250ms apart recorded 148ms apart). At
// 500ms the check still fails without the limits (shown: 4 events of a
// key within 3ms exceed 1 + 4/s * 0.5s, 13 of stock within 2ms exceed
// 2 + 20/s * 0.5s).
const bucketJitter = 500 * time.Millisecond

// checkBucket checks the token bucket's invariant on times: between the
// i-th and the j-th, j-i+1 events at most burst + rate*(t_j - t_i +
// bucketJitter).
func checkBucket(t *testing.T, what string, times []time.Time, rate float64, burst int) {
	t.Helper()
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	for i := range times {
		for j := i; j < len(times); j++ {
			n := float64(j - i + 1)
			allowed := float64(burst) + rate*(times[j].Sub(times[i])+bucketJitter).Seconds()
			if n > allowed {
				t.Errorf("%s: %d events applied within %v, want at most %.1f (rate %v/s, burst %d)",
					what, j-i+1, times[j].Sub(times[i]), allowed, rate, burst)
				return
			}
		}
	}
}
