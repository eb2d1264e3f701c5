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

// The in-process broker passes the conformance suite, but for what only a
// server can do (restart, a process killed, dead letters).
func TestConformance(t *testing.T) {
	brokertest.Run(t, brokertest.Transport{
		New: func(t *testing.T, o brokertest.Options) brokertest.Instance {
			pub := memory.New()
			pub.Declare(o.Consumers...)
			return brokertest.Instance{
				Publisher: pub,
				NewSubscriber: func(t *testing.T, consumer string, deliver broker.DeliverFunc) broker.Subscriber {
					sub, err := pub.NewSubscriber(memory.SubscriberConfig{Consumer: consumer, Logger: brokertest.LogTo(t)}, deliver)
					if err != nil {
						t.Fatal(err)
					}
					return sub
				},
				PublishRaw: func(t *testing.T, _ string, body []byte, headers map[string]string) {
					brokertest.Publish(t, pub, idem.Message{Body: body, Headers: headers})
				},
				Backlog: func(_ *testing.T, consumer string) int { return pub.Pending(consumer) },
			}
		},
		Features: brokertest.Features{PerKeyOrder: true, Redeliver: true, ConsumerPublisher: true, Inspect: true},
	})
}

// The publisher's own test controls (Fail, SetFunc) pass the publisher
// part of the suite.
func TestConformancePublisher(t *testing.T) {
	brokertest.RunPublisher(t, brokertest.PublisherTransport{
		Features: brokertest.PublisherFeatures{Redeliver: true, Inspect: true},
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
