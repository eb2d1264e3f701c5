package amqp

import (
	"log/slog"
	"sync"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// acker settles the deliveries of one channel. Batches finish out of order
// (several workers, retries waiting for confirms), so it tracks the lowest
// tag not yet settled and acknowledges everything below it with one
// multiple ack. Messages settled above that floor wait for it, unless more
// than maxHeld of them wait, in which case they are acknowledged one by one.
type acker struct {
	mu      sync.Mutex
	ch      *amqp091.Channel
	log     *slog.Logger
	maxHeld int

	floor uint64          // every tag <= floor is settled
	state map[uint64]bool // settled tags above floor: true while still to ack
	held  int             // entries of state that are true
}

func newAcker(ch *amqp091.Channel, maxHeld int, log *slog.Logger) *acker {
	return &acker{ch: ch, log: log, maxHeld: max(maxHeld, 1), state: map[uint64]bool{}}
}

// ack acknowledges tags.
func (a *acker) ack(tags []uint64) {
	if len(tags) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, t := range tags {
		a.state[t] = true
		a.held++
	}
	a.advance()
}

// nack returns tags to the queue.
func (a *acker) nack(tags []uint64) {
	if len(tags) == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, t := range tags {
		if err := a.ch.Nack(t, false, true); err != nil {
			a.log.Debug("amqp subscriber: nack failed (the broker requeues unacked messages when the channel closes)", "error", err)
		}
		a.state[t] = false
	}
	a.advance()
}

// advance moves the floor over settled tags and sends the acks due; a.mu is
// held.
func (a *acker) advance() {
	var last uint64 // highest tag passed that is still to ack
	for {
		v, ok := a.state[a.floor+1]
		if !ok {
			break
		}
		delete(a.state, a.floor+1)
		a.floor++
		if v {
			a.held--
			last = a.floor
		}
	}
	if last > 0 {
		// Multiple: every unacknowledged tag up to last. Tags in between were
		// settled already, which a multiple ack allows.
		a.send(last, true)
	}
	if a.held > a.maxHeld {
		for t, v := range a.state {
			if v {
				a.send(t, false)
				a.state[t] = false
			}
		}
		a.held = 0
	}
}

func (a *acker) send(tag uint64, multiple bool) {
	if err := a.ch.Ack(tag, multiple); err != nil {
		a.log.Debug("amqp subscriber: ack failed (the message will be redelivered and deduplicated)", "error", err)
	}
}
