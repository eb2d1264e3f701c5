package cdc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/internal/logengine/logenginetest"
)

// TestConformance runs the log relays' suite against the PostgreSQL slot.
func TestConformance(t *testing.T) {
	logenginetest.Run(t, logenginetest.Harness{
		New: func(t *testing.T) logenginetest.Outbox {
			pg := newDB(t)
			w := outbox.NewWriter(pg.Driver)
			return logenginetest.Outbox{
				Relay: func(t *testing.T, pub broker.Publisher, o logenginetest.Options) logenginetest.Relay {
					cfg := fastConfig(t)
					cfg.Tables.Schema, cfg.MessagePrefix = pg.Schema, pg.Schema
					cfg.QuarantineAfter, cfg.Now, cfg.DueInterval = o.QuarantineAfter, o.Now, o.DueInterval
					cfg.OnQuarantine = o.OnQuarantine
					if !o.Archive {
						cfg.ArchiveRetention = -1
					}
					r, err := cdc.New(pg.URL, pub, cfg)
					if err != nil {
						t.Fatal(err)
					}
					return r
				},
				Add: func(t *testing.T, rollback bool, events ...idem.Event) {
					ctx := context.Background()
					tx, err := pg.Pool.Begin(ctx)
					if err == nil {
						err = w.Add(ctx, tx, events...)
					}
					if err == nil && !rollback {
						err = tx.Commit(ctx)
					}
					if tx != nil {
						_ = tx.Rollback(ctx)
					}
					if err != nil {
						t.Fatal(err)
					}
				},
				Count: func(t *testing.T, fromWhere string, args ...any) int { return pg.Count(t, dollars(fromWhere), args...) },
				Exec:  func(t *testing.T, query string, args ...any) { pg.Exec(t, dollars(query), args...) },
				DB:    pg.Driver,
				Notices: func(*testing.T) func(context.Context, driver.Executor, idem.FailureNotice) error {
					return outbox.FailureEvents(outbox.NewWriter(pg.Driver), outbox.FailureEventsConfig{})
				},
			}
		},
		Silent: func(t *testing.T, addr string) logenginetest.Relay {
			r, err := cdc.New(fmt.Sprintf("postgres://idem@%s/idem?sslmode=disable&connect_timeout=60", addr), memory.New(), cdc.Config{Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
	})
}

// dollars numbers the ? of a statement as PostgreSQL's $1, $2...
func dollars(q string) string {
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}
