package memory_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
)

func Example() {
	pub := memory.New()
	ev, _ := idem.NewEvent("order.order.placed.v1", "order", "42", map[string]int{"lines": 2})
	msg, _ := idem.NewMessage(ev)
	ctx := context.Background()

	pub.Fail(errors.New("broker down"))
	fmt.Println(pub.Publish(ctx, []idem.Message{msg}))
	pub.Recover()

	// Refuse one message of a call: the error says which.
	pub.SetFunc(func(call int, _ []idem.Message) memory.Action {
		return memory.Action{Refuse: func(m idem.Message) error {
			if string(m.Key) == "42" {
				return errors.New("too large")
			}
			return nil
		}}
	})
	err := pub.Publish(ctx, []idem.Message{msg})
	fmt.Println(broker.Results(err, 1)[0])
	pub.SetFunc(nil)

	fmt.Println(pub.Publish(ctx, []idem.Message{msg}), pub.Len(), pub.Calls())
	// Output:
	// broker down
	// too large
	// <nil> 1 3
}
