package memory_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/brokertest"
	"github.com/idem-go/idem/broker/memory"
)

// The in-process publisher has no subscriber: it passes the publisher part
// of the conformance suite.
func TestConformance(t *testing.T) {
	brokertest.RunPublisher(t, brokertest.PublisherTransport{
		New: func(t *testing.T) brokertest.PublisherInstance {
			pub := memory.New()
			return brokertest.PublisherInstance{
				Publisher: pub,
				Accepted:  func(*testing.T) []idem.Message { return pub.Messages() },
				Refuse: func(_ *testing.T, refuse func(idem.Message) bool) {
					if refuse == nil {
						pub.SetFunc(nil)
						return
					}
					pub.SetFunc(func(int, []idem.Message) memory.Action {
						return memory.Action{Refuse: func(m idem.Message) error {
							if refuse(m) {
								return fmt.Errorf("no binding for %s: %w", m.EventName, broker.ErrUnroutable)
							}
							return nil
						}}
					})
				},
				Away: func(_ *testing.T, away bool) {
					if away {
						pub.Fail(errors.New("broker away"))
					} else {
						pub.Recover()
					}
				},
			}
		},
	})
}
