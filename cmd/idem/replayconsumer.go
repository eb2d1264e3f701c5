package main

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/registry"
)

// openConsumer opens the broker of "idem replay --to-consumer": one that
// publishes to one consumer (broker.ConsumerPublisher), kept in o.cp for
// the replay, or one whose consumers rewind (broker.Rewinder: Kafka), which
// it rewinds to from at once, reporting done.
func (o *replayOptions) openConsumer(ctx context.Context, e *env, from time.Time) (done bool, err error) {
	u := o.br.Resolve(e.getenv)
	pub, err := registry.OpenPrefixed(ctx, u, o.prefix)
	if err != nil {
		return false, err
	}
	if cp, ok := pub.(broker.ConsumerPublisher); ok {
		o.cp, o.closeConsumer = cp, func() { _ = pub.Close() }
		return false, nil
	}
	defer pub.Close()
	rw, ok := pub.(broker.Rewinder)
	if !ok {
		return false, fmt.Errorf("the broker at %s can neither publish to one consumer only nor rewind one (its publisher is no broker.ConsumerPublisher nor broker.Rewinder)", broker.RedactURL(u))
	}
	return true, o.rewind(ctx, e, rw, from)
}

// rewind moves consumer o.toConsumer's position back to from: its
// subscribers, started again, read every record from then on, and skip the
// events they applied.
func (o *replayOptions) rewind(ctx context.Context, e *env, rw broker.Rewinder, from time.Time) error {
	if o.untilGiven || o.event != "" || o.aggType != "" {
		return usagef("--until, --event and --aggregate-type do not go with a rewind: on Kafka, --to-consumer moves the consumer's group back to --since, and it reads every record from then on")
	}
	at := from.UTC().Format(time.RFC3339)
	if !o.yes && !confirm(e, fmt.Sprintf("Rewind consumer %s's group to %s? Its subscribers must be stopped; started again, they read every record from then on", o.toConsumer, at)) {
		return fmt.Errorf("rewind cancelled: nothing moved")
	}
	n, err := rw.Rewind(ctx, o.toConsumer, from)
	if err != nil {
		return err
	}
	if n == 0 {
		fmt.Fprintf(e.stdout, "Consumer %s's group is at %s or before on every partition it read: nothing moved.\n", o.toConsumer, at)
		return nil
	}
	fmt.Fprintf(e.stdout, "Rewound consumer %s's group to %s on %d partition(s). Start its subscribers: they read again from there and skip the events they applied.\n", o.toConsumer, at, n)
	return nil
}
