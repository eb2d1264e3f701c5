package inbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/mutant"
)

// Delivery is a message as a transport received it (broker.Delivery).
type Delivery = broker.Delivery

// Action tells a transport what to do with a delivery (broker.Action).
type Action = broker.Action

// Actions: see broker.Action.
const (
	Ack   = broker.Ack
	Retry = broker.Retry
	Pause = broker.Pause
)

// Disposition is the consumer's verdict on a delivery (broker.Disposition).
type Disposition = broker.Disposition

// storeTimeout bounds the writes that record a failure (attempt count,
// failure store), which run after the delivery's own context may have ended.
const storeTimeout = 10 * time.Second

// Deliver decodes d, processes it, and decides what the transport does next.
// It is DeliverBatch for one delivery.
func (c *Consumer[TTx]) Deliver(ctx context.Context, d Delivery) (Disposition, error) {
	disps, errs := c.DeliverBatch(ctx, []Delivery{d})
	return disps[0], errs[0]
}

// item is a delivery on its way through DeliverBatch.
type item struct {
	ev        idem.Event
	decodeErr error
	agg       idem.AggregateRef
	// redrive is the failure store id of the parked message this one
	// re-drives (idem.HeaderRedrive), 0 for a plain delivery. Once
	// checkRedrives has run, it names an entry of this consumer that holds
	// this message's body.
	redrive int64
	// span is the delivery's consumer span, nil when there is no trace;
	// baggage the baggage that came with the message.
	span    trace.Span
	baggage baggage.Baggage
}

// block is why the later events of an aggregate wait in one DeliverBatch
// call: an earlier one is parked (parked is its failure store id) or waits
// for a retry or a pause (disp).
type block struct {
	parked int64
	disp   Disposition
}

// DeliverBatch decodes deliveries, processes them (several in one
// transaction when it can) and says what the transport does with each; the
// i-th disposition and error are for ds[i]. Within the call, the events of
// one aggregate are processed in the order given.
//
// Failures are sorted by what they mean:
//
//   - A body that cannot be decoded, or a handler error wrapped with
//     idem.Permanent, is parked at once in the failure store with the raw
//     message, and acknowledged (Ack, Outcome Parked).
//   - A transient failure (the consumer's own database unreachable, a
//     serialization failure or deadlock, a network error, the delivery
//     timing out, or a handler error wrapped with idem.Transient) costs no
//     attempt: the consumer pauses (Action Pause) with a capped backoff and
//     answers Pause to every delivery, without touching the database, until
//     the pause ends; the next delivery tries again. An event that keeps
//     failing transiently for longer than Config.OutageBudget has its
//     failures counted as below.
//   - Any other handler error counts one attempt, in the database
//     (delivery_attempt), so the count survives restarts and rebalances.
//     While the retry policy allows, the transport retries after a delay
//     (Action Retry); after the last attempt the message is parked.
//
// While an operator's pause is in force (PauseStore), every delivery is
// answered Pause (Outcome Paused) before any handler runs, with a
// RetryAfter of at most Config.PauseCheck: no attempt is counted and
// nothing is parked. With limits (Config.RateLimit, KeyLimit,
// MaxConcurrent), a delivery waits for its turn, up to Config.RateWaitMax;
// one that would wait longer is handed back, Outcome Deferred: Action
// Pause, with the rest of the call, when the consumer's rate or
// concurrency holds it, Action Retry when its key's rate does.
//
// Once an event of an aggregate waits for a retry or a pause, the later
// events of that aggregate in the same call are not attempted (Outcome
// Deferred, with the same action and delay): the transport delivers them
// again after it. Once an event is parked, the later events of its
// aggregate are parked behind it (Config.Parked HoldAggregate, the
// default), in this call and in later ones until an operator re-drives or
// removes it; with ReleaseAggregate they go on.
//
// A non-nil error at index i means that delivery could be neither handled
// nor parked for a reason other than a transient one: the transport must not
// acknowledge it and should deliver it again later.
func (c *Consumer[TTx]) DeliverBatch(ctx context.Context, ds []Delivery) ([]Disposition, []error) {
	disps := make([]Disposition, len(ds))
	errs := make([]error, len(ds))
	if len(ds) == 0 {
		return disps, errs
	}
	c.observeBatch(len(ds))
	defer c.countDispositions(disps)
	if mutant.Enabled && mutant.On(mutant.InboxAckBeforeCommit) {
		defer ackAll(disps, errs)
	}
	items := make([]item, len(ds))
	for i, d := range ds {
		items[i] = c.decode(d)
	}
	c.startSpans(ctx, ds, items)
	defer endSpans(items, disps, errs)
	if wait := c.gate.wait(); wait > 0 {
		for i := range items {
			disps[i] = Disposition{Action: Pause, Outcome: Paused, RetryAfter: wait, Event: items[i].ev}
		}
		return disps, errs
	}
	if c.handBack(ctx, items, disps) {
		return disps, errs
	}
	if err := c.checkRedrives(ctx, ds, items); err != nil {
		c.pauseAll(ctx, items, disps, err)
		return disps, errs
	}
	holds, err := c.heldAggregates(ctx, items)
	if err != nil {
		c.pauseAll(ctx, items, disps, err)
		return disps, errs
	}
	if len(items) > 1 && len(holds) == 0 && c.limits == nil && c.allDecoded(items) && c.tryBatch(ctx, items, disps) {
		return disps, errs
	}
	blocked := map[idem.AggregateRef]block{}
	// overRate, once the consumer's own rate or concurrency made one
	// delivery wait too long, is the answer to the rest of the call.
	var overRate Disposition
	for i := range items {
		it := &items[i]
		if b, ok := blocked[it.agg]; ok && it.agg.ID != "" {
			disps[i], errs[i] = c.behind(ctx, ds[i], it, b)
			continue
		}
		// A message re-driven by an operator waits only behind messages
		// parked before it; any other waits behind any, unless it is the
		// parked message itself, sent again by other means.
		if root, ok := holds[it.agg]; ok && it.agg.ID != "" && it.redrive == 0 && c.isParked(ctx, root, it.ev.ID, ds[i].Message.Body) {
			it.redrive = root
		}
		if root, ok := holds[it.agg]; ok && it.agg.ID != "" && (it.redrive == 0 || root < it.redrive) {
			disps[i], errs[i] = c.behind(ctx, ds[i], it, block{parked: root})
			if errs[i] == nil {
				blocked[it.agg] = block{parked: root}
			}
			continue
		}
		var parkedID int64
		switch {
		case it.decodeErr != nil:
			disps[i], parkedID, errs[i] = c.park(ctx, ds[i], it, it.decodeErr, 0, 1)
		default:
			if wait := c.gate.wait(); wait > 0 {
				disps[i] = Disposition{Action: Pause, Outcome: Paused, RetryAfter: wait, Event: it.ev}
				break
			}
			if c.handBack(ctx, items[i:i+1], disps[i:i+1]) {
				break
			}
			if overRate.Action != 0 {
				disps[i] = overRate
				disps[i].Event = it.ev
				c.stats.rateLimited.Add(1)
				break
			}
			release := noop
			if c.limits != nil {
				var ok bool
				if disps[i], release, ok = c.admit(ctx, it.ev); !ok {
					if disps[i].Action == Pause && disps[i].Outcome == Deferred {
						overRate = disps[i]
					}
					break
				}
			}
			pctx, cancel := context.WithTimeout(itemContext(ctx, it), c.cfg.DeliveryTimeout)
			o, err := c.process(pctx, it.ev)
			cancel()
			release()
			disps[i], parkedID, errs[i] = c.settle(ctx, ds[i], it, o, err)
			if disps[i].Action == Ack && it.redrive != 0 && holds[it.agg] == it.redrive {
				delete(holds, it.agg) // its entry is gone: it holds nothing any more
			}
		}
		if it.agg.ID == "" {
			continue
		}
		switch {
		case errs[i] != nil:
			blocked[it.agg] = block{disp: Disposition{Action: Retry, RetryAfter: time.Second}}
		case disps[i].Outcome == Parked && c.cfg.Parked == HoldAggregate && parkedID != 0:
			blocked[it.agg] = block{parked: parkedID}
		case disps[i].Action != Ack:
			blocked[it.agg] = block{disp: disps[i]}
		}
	}
	return disps, errs
}

// ackAll is the mutant InboxAckBeforeCommit: every delivery acknowledged,
// whatever its transaction did. Only builds with the tag idemmutant call
// it.
func ackAll(disps []Disposition, errs []error) {
	for i := range disps {
		disps[i].Action, errs[i] = Ack, nil
	}
}

// admit waits for the limits to let ev through, and returns the function
// that ends its turn, true; or the disposition that hands it back, false.
func (c *Consumer[TTx]) admit(ctx context.Context, ev idem.Event) (Disposition, func(), bool) {
	why, waited, retry, release := c.limits.admit(ctx, ev)
	c.stats.rateWait.Add(uint64(waited))
	switch why {
	case admitted:
		return Disposition{}, release, true
	case cancelled:
		return Disposition{Action: Pause, Outcome: Paused, Err: ctx.Err(), Event: ev}, noop, false
	case overKey:
		c.stats.rateLimited.Add(1)
		return Disposition{Action: Retry, Outcome: Deferred, RetryAfter: retry, Event: ev}, noop, false
	}
	c.stats.rateLimited.Add(1)
	return Disposition{Action: Pause, Outcome: Deferred, RetryAfter: retry, Event: ev}, noop, false
}

// decode decodes d and finds its aggregate.
func (c *Consumer[TTx]) decode(d Delivery) item {
	ev, err := c.cfg.Decoder.Decode(d.Message)
	it := item{ev: ev, decodeErr: err}
	if ev.AggregateID != "" {
		it.agg = idem.AggregateRef{Type: storedName(ev.AggregateType), ID: storedName(ev.AggregateID)}
	}
	if v := d.Message.Headers[idem.HeaderRedrive]; v != "" {
		if id, perr := strconv.ParseInt(v, 10, 64); perr == nil && id > 0 {
			it.redrive = id
		}
	}
	return it
}

func (c *Consumer[TTx]) allDecoded(items []item) bool {
	for _, it := range items {
		if it.decodeErr != nil {
			return false
		}
	}
	return true
}

// tryBatch processes every item in one transaction. It reports whether the
// dispositions are filled: the batch committed, or it failed transiently
// (everything paused). A handler's failure returns false, for one at a
// time.
func (c *Consumer[TTx]) tryBatch(ctx context.Context, items []item, disps []Disposition) bool {
	events := make([]idem.Event, len(items))
	for i, it := range items {
		events[i] = it.ev
	}
	results := make([]Result, len(items))
	bctx, cancel := context.WithTimeout(ctx, c.cfg.DeliveryTimeout)
	err := c.batch(bctx, events, results, items)
	cancel()
	if err == nil {
		c.resumed()
		for i, r := range results {
			disps[i] = Disposition{Action: Ack, Outcome: r.Outcome, Event: events[i]}
			c.succeeded(ctx, &items[i])
		}
		return true
	}
	var herr *HandlerError
	if errors.As(err, &herr) {
		return false
	}
	if cl := c.classify(ctx, err); cl == transient || cl == stopping {
		c.pauseAll(ctx, items, disps, err)
		return true
	}
	return false
}

// pauseAll answers Pause to every item: the consumer's database failed.
func (c *Consumer[TTx]) pauseAll(ctx context.Context, items []item, disps []Disposition, err error) {
	wait := time.Duration(0)
	if ctx.Err() == nil {
		wait = c.pause(err)
	}
	for i := range items {
		disps[i] = Disposition{Action: Pause, Outcome: Paused, RetryAfter: wait, Err: err, Event: items[i].ev}
	}
}

// pause starts or extends the consumer's pause after a transient failure,
// and returns its length.
func (c *Consumer[TTx]) pause(err error) time.Duration {
	wait, first := c.gate.fail()
	if first {
		c.log.Warn("consumer paused: a dependency is away; messages stay in the broker and are tried again",
			"retry_in", wait.Round(time.Millisecond), "error", err)
	}
	return wait
}

// resumed records a success, ending a pause.
func (c *Consumer[TTx]) resumed() {
	if d := c.gate.ok(); d > 0 {
		c.log.Info("consumer resumed", "paused_for", d.Round(time.Millisecond))
	}
}

// succeeded forgets the failures of an event that is now done, and removes
// from the failure store the parked message it re-drives.
func (c *Consumer[TTx]) succeeded(ctx context.Context, it *item) {
	id := it.ev.ID
	c.failing.forget(id)
	if c.attempted.forget(id) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
		if err := c.drv.Dialect().ClearAttempts(cctx, c.drv.Pool(), c.cfg.Name, []uuid.UUID{id}); err != nil {
			c.log.Debug("forget the failed attempts of an applied event", "event_id", id, "error", err)
		}
		cancel()
	}
	if it.redrive != 0 {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
		defer cancel()
		removed, err := c.failures.resolve(cctx, it.redrive, idem.ResolvedRetried)
		if err != nil {
			c.log.Warn("re-driven message applied, but its failure store entry could not be removed; remove it with idem failed remove",
				"failed_message_id", it.redrive, "event_id", id, "error", err)
			return
		}
		if removed {
			c.log.Info("re-driven message done; removed from the failure store", "failed_message_id", it.redrive, "event_id", id)
		}
	}
}

// settle decides what follows processing it: o and err are Process's. It
// returns the failure store id when it parked the message.
func (c *Consumer[TTx]) settle(ctx context.Context, d Delivery, it *item, o Outcome, err error) (Disposition, int64, error) {
	ev := it.ev
	if err == nil {
		c.resumed()
		c.succeeded(ctx, it)
		return Disposition{Action: Ack, Outcome: o, Event: ev}, 0, nil
	}
	switch c.classify(ctx, err) {
	case permanent:
		return c.park(ctx, d, it, err, 0, 1)
	case stopping:
		// Shutting down: neither count nor park an event that failed
		// because of it.
		return Disposition{Action: Pause, Outcome: Paused, Err: err, Event: ev}, 0, nil
	case transient:
		now := c.cfg.Now()
		since := c.failing.first(ev.ID, now)
		if now.Sub(since) < c.cfg.OutageBudget {
			return Disposition{Action: Pause, Outcome: Paused, RetryAfter: c.pause(err), Err: err, Event: ev}, 0, nil
		}
		c.log.Warn("event failing transiently for longer than the outage budget; counting its failures as attempts",
			"event_id", ev.ID, "event_name", ev.Name, "failing_since", since, "outage_budget", c.cfg.OutageBudget, "error", err)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	n, rerr := c.drv.Dialect().RecordAttempt(rctx, c.drv.Pool(), c.cfg.Name, ev.ID, err.Error())
	cancel()
	if rerr != nil {
		// The failure cannot be counted: the database misbehaves.
		return Disposition{Action: Pause, Outcome: Paused, RetryAfter: c.pause(rerr), Err: err, Event: ev}, 0, nil
	}
	c.attempted.first(ev.ID, c.cfg.Now())
	if c.cfg.Retry.Retry(n) {
		return Disposition{Action: Retry, Outcome: Failed, RetryAfter: c.cfg.Retry.Delay(n), Attempts: n, Err: err, Event: ev}, 0, nil
	}
	return c.park(ctx, d, it, err, 0, n)
}

// behind answers a delivery whose aggregate waits behind b.
func (c *Consumer[TTx]) behind(ctx context.Context, d Delivery, it *item, b block) (Disposition, error) {
	if b.parked == 0 {
		return Disposition{Action: b.disp.Action, Outcome: Deferred, RetryAfter: b.disp.RetryAfter, Event: it.ev}, nil
	}
	cause := fmt.Errorf("idem: held behind parked message %d of aggregate %s %s, which is retried or removed first", b.parked, it.agg.Type, it.agg.ID)
	disp, _, err := c.park(ctx, d, it, cause, b.parked, 1)
	return disp, err
}

// heldAggregates returns the parked messages that hold the items'
// aggregates, by aggregate (Config.Parked HoldAggregate).
func (c *Consumer[TTx]) heldAggregates(ctx context.Context, items []item) (map[idem.AggregateRef]int64, error) {
	if c.cfg.Parked != HoldAggregate {
		return nil, nil
	}
	qctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	has, err := c.parked.get(func() (bool, error) {
		return c.drv.Dialect().HasParkedAggregates(qctx, c.drv.Pool(), c.cfg.Name)
	})
	if err != nil || !has {
		return nil, err
	}
	seen := map[idem.AggregateRef]bool{}
	var aggs []idem.AggregateRef
	for _, it := range items {
		if it.agg.ID != "" && !seen[it.agg] {
			seen[it.agg] = true
			aggs = append(aggs, it.agg)
		}
	}
	if len(aggs) == 0 {
		return nil, nil
	}
	return c.drv.Dialect().ParkedAggregates(qctx, c.drv.Pool(), c.cfg.Name, aggs)
}

// checkRedrives keeps the re-drive mark (idem.HeaderRedrive) of the items
// whose header names an entry of this consumer that holds the delivery's
// body, byte for byte: the parked message they are a copy of. A header that
// names an entry that is gone, another consumer's or another message's is
// dropped: the delivery is a plain one, which neither updates nor removes
// that entry. It returns the error of a database that is away for now.
func (c *Consumer[TTx]) checkRedrives(ctx context.Context, ds []Delivery, items []item) error {
	for i := range items {
		it := &items[i]
		if it.redrive == 0 {
			continue
		}
		ok, err := c.entryHolds(ctx, it.redrive, ds[i].Message.Body, uuid.Nil)
		if err != nil && (ctx.Err() != nil || c.isTransient(err)) {
			return err
		}
		if err != nil {
			c.log.Warn("the failure store entry a re-drive header names cannot be read; handled as a plain delivery",
				"failed_message_id", it.redrive, "event_id", it.ev.ID, "error", err)
			it.redrive = 0
			continue
		}
		if !ok {
			c.log.Info("re-drive header names no failure store entry of this message; handled as a plain delivery",
				"failed_message_id", it.redrive, "event_id", it.ev.ID)
			it.redrive = 0
		}
	}
	return nil
}

// entryHolds reports whether the failure store entry id is an entry of this
// consumer that holds body byte for byte, as edited or as received, and,
// unless ev is uuid.Nil, event ev.
func (c *Consumer[TTx]) entryHolds(ctx context.Context, id int64, body []byte, ev uuid.UUID) (bool, error) {
	qctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	m, err := c.failures.Get(qctx, id)
	if errors.Is(err, idem.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	held := bytes.Equal(m.Body, body) || (m.Original != nil && bytes.Equal(m.Original.Body, body))
	return m.Consumer == c.cfg.Name && held && (ev == uuid.Nil || m.EventID == ev), nil
}

// isParked reports whether the parked message id is the message of event ev
// with body body itself. Another message that reuses the event id is not.
func (c *Consumer[TTx]) isParked(ctx context.Context, id int64, ev uuid.UUID, body []byte) bool {
	if ev == uuid.Nil {
		return false
	}
	ok, err := c.entryHolds(ctx, id, body, ev)
	return err == nil && ok
}

// park stores the delivery in the failure store, with the count of failed
// attempts, and forgets those attempts; heldBy is the parked message it
// waits behind, if any. A re-driven message is parked again in the entry it
// came from; any other message in an entry of its own, unless a copy of it
// is parked already (see saveFailed). It returns the entry's id.
func (c *Consumer[TTx]) park(ctx context.Context, d Delivery, it *item, cause error, heldBy int64, attempts int) (Disposition, int64, error) {
	ev := it.ev
	headers := d.Message.Headers
	if _, ok := headers[idem.HeaderRedrive]; ok {
		// The mark of a re-drive is not part of the message.
		headers = maps.Clone(headers)
		delete(headers, idem.HeaderRedrive)
	}
	m := idem.FailedMessage{
		ID:            it.redrive,
		Consumer:      c.cfg.Name,
		Source:        d.Source,
		EventID:       ev.ID,
		EventName:     ev.Name,
		AggregateType: it.agg.Type,
		AggregateID:   it.agg.ID,
		HeldBy:        heldBy,
		Key:           d.Message.Key,
		Headers:       headers,
		Body:          d.Message.Body,
		Error:         cause.Error(),
		Attempts:      max(attempts, 1),
	}
	if m.EventID == uuid.Nil {
		m.EventID = d.Message.EventID
	}
	if m.EventName == "" {
		m.EventName = d.Message.EventName
	}
	m.EventName = storedName(m.EventName)
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	id, err := c.saveFailed(pctx, m)
	cancel()
	if err != nil {
		if c.isTransient(err) {
			return Disposition{Action: Pause, Outcome: Paused, RetryAfter: c.pause(err), Err: cause, Event: ev}, 0, nil
		}
		return Disposition{Action: Retry, Outcome: Failed, Err: cause, Event: ev}, 0,
			fmt.Errorf("idem: inbox %s: park message in failure store: %w (message error: %v)", c.cfg.Name, err, cause)
	}
	c.resumed()
	c.failing.forget(m.EventID)
	c.attempted.forget(m.EventID)
	attrs := []any{"failed_message_id", id, "event_id", m.EventID, "event_name", m.EventName, "source", d.Source,
		"attempts", m.Attempts, "error", cause}
	switch {
	case heldBy != 0:
		c.stats.heldBack.Add(1)
		c.log.Warn("message parked behind an earlier parked event of its aggregate",
			append(attrs, "aggregate_type", m.AggregateType, "aggregate_id", m.AggregateID, "held_by", heldBy)...)
	case m.AggregateID != "" && c.cfg.Parked == HoldAggregate:
		c.parked.set()
		c.log.Warn("message parked in failure store; its aggregate is held until it is retried or removed (idem failed retry/remove)",
			append(attrs, "reason", reason(cause), "aggregate_type", m.AggregateType, "aggregate_id", m.AggregateID)...)
	default:
		c.log.Warn("message parked in failure store", append(attrs, "reason", reason(cause))...)
	}
	return Disposition{Action: Ack, Outcome: Parked, Attempts: m.Attempts, Err: cause, Event: ev}, id, nil
}

// storedNameMax bounds the names the failure store keeps to list, filter
// and hold messages by (event name, aggregate type and id): every dialect's
// columns take them (MySQL's are VARCHAR(255)). The raw message, kept byte
// for byte, holds the full values.
const storedNameMax = 200

// storedName returns s as the failure store keeps it in a name column: as
// it is when it is printable UTF-8 of at most storedNameMax bytes, else with
// invalid bytes and control characters replaced by U+FFFD and cut to that
// length, so that a hostile name never stops a message from being parked.
func storedName(s string) string {
	plain := len(s) <= storedNameMax && utf8.ValidString(s) &&
		strings.IndexFunc(s, unicode.IsControl) < 0 && strings.TrimRight(s, " ") == s
	if plain {
		return s
	}
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return utf8.RuneError
		}
		return r
	}, strings.ToValidUTF8(s, string(utf8.RuneError)))
	s = strings.TrimRight(s, " ")
	if len(s) > storedNameMax {
		cut := storedNameMax
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

func reason(cause error) string {
	switch {
	case errors.Is(cause, idem.ErrUndecodable):
		return "undecodable"
	case idem.IsPermanent(cause):
		return "permanent error"
	}
	return "attempts exhausted"
}

// saveFailed stores m, forgets its event's failed attempts and calls
// Config.OnFailure with its notice, in one transaction. m.ID, when set, is
// the entry m re-drives, which the save updates. Otherwise an entry holding
// a copy of m (same event id, same body, as received or as edited: a
// broker's redelivery after a crash between the park and the
// acknowledgement, a relay's republish) is updated rather than a second
// one added; any other message gets an entry of its own, even when it
// reuses a parked message's event id. Two copies parked at the same moment by two
// workers may each add one: a copy too many, never a message lost.
func (c *Consumer[TTx]) saveFailed(ctx context.Context, m idem.FailedMessage) (id int64, err error) {
	tx, err := c.drv.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = c.drv.Rollback(context.WithoutCancel(ctx), tx)
		}
	}()
	d, ex := c.drv.Dialect(), c.drv.Tx(tx)
	copied := false
	if m.ID == 0 && m.EventID != uuid.Nil {
		if m.ID, err = d.FindFailed(ctx, ex, m.Consumer, m.EventID, m.Body); err != nil {
			return 0, err
		}
		copied = m.ID != 0
	}
	if m.ID != 0 && m.ID == m.HeldBy {
		// A copy of the parked message that holds the aggregate, held
		// behind it in the same delivery: it is that entry already.
		return m.ID, c.clearAttemptsAndCommit(ctx, tx, m)
	}
	notify := c.cfg.OnFailure != nil && !idem.IsFailureNotice(m.EventName)
	if notify && copied {
		// A copy of a message parked already was told of then, unless
		// an operator archived it since.
		prev, err := d.GetFailed(ctx, ex, m.ID)
		if err != nil {
			return 0, err
		}
		notify = !prev.Archived.IsZero()
	}
	if id, err = d.SaveFailed(ctx, ex, m); err != nil {
		return 0, err
	}
	if notify {
		m.ID = id
		if err := c.cfg.OnFailure(ctx, ex, Notice(idem.FailureMessageParked, m)); err != nil {
			return 0, fmt.Errorf("idem: inbox %s: failure hook: %w", c.cfg.Name, err)
		}
	}
	return id, c.clearAttemptsAndCommit(ctx, tx, m)
}

// clearAttemptsAndCommit forgets the failed attempts of m's event and
// commits tx, the transaction that parked m.
func (c *Consumer[TTx]) clearAttemptsAndCommit(ctx context.Context, tx TTx, m idem.FailedMessage) error {
	if m.EventID != uuid.Nil {
		if err := c.drv.Dialect().ClearAttempts(ctx, c.drv.Tx(tx), c.cfg.Name, []uuid.UUID{m.EventID}); err != nil {
			return err
		}
	}
	return c.drv.Commit(ctx, tx)
}
