package binlog_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testlog"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay/binlog"
	"github.com/idem-go/idem/relay/internal/logengine/logenginetest"
)

// TestConformance runs the log relays' suite against MariaDB's binlog.
func TestConformance(t *testing.T) {
	logenginetest.Run(t, logenginetest.Harness{
		New: func(t *testing.T) logenginetest.Outbox {
			db := testdb.NewMariaDB(t)
			w := outbox.NewWriter(db.Driver)
			return logenginetest.Outbox{
				Relay: func(t *testing.T, pub broker.Publisher, o logenginetest.Options) logenginetest.Relay {
					cfg := fastConfig(t)
					cfg.QuarantineAfter, cfg.Now, cfg.DueInterval = o.QuarantineAfter, o.Now, o.DueInterval
					cfg.OnQuarantine = o.OnQuarantine
					if !o.Archive {
						cfg.ArchiveRetention = -1
					}
					r, err := binlog.New(db.URL, pub, cfg)
					if err != nil {
						t.Fatal(err)
					}
					return r
				},
				Add: func(t *testing.T, rollback bool, events ...idem.Event) {
					ctx := context.Background()
					tx, err := db.DB.BeginTx(ctx, nil)
					if err == nil {
						err = w.Add(ctx, tx, events...)
					}
					if err == nil && !rollback {
						err = tx.Commit()
					}
					if tx != nil {
						_ = tx.Rollback()
					}
					if err != nil {
						t.Fatal(err)
					}
				},
				Count: func(t *testing.T, fromWhere string, args ...any) int { return db.Count(t, fromWhere, args...) },
				Exec:  func(t *testing.T, query string, args ...any) { db.Exec(t, query, args...) },
				DB:    db.Driver,
				Notices: func(*testing.T) func(context.Context, driver.Executor, idem.FailureNotice) error {
					return outbox.FailureEvents(outbox.NewWriter(db.Driver), outbox.FailureEventsConfig{})
				},
			}
		},
		Silent: func(t *testing.T, addr string) logenginetest.Relay {
			r, err := binlog.New("mysql://idem:idem@"+addr+"/idem", memory.New(), binlog.Config{Logger: testlog.New(t)})
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
		Serial: true,
	})
}
