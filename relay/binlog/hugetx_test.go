package binlog_test

import (
	"testing"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/relay/binlog"
	"github.com/idem-go/idem/relay/internal/logengine/logenginetest"
)

// TestHugeTransaction: one transaction of a backfill's size, relayed in
// bounded memory (logenginetest.HugeTransaction).
func TestHugeTransaction(t *testing.T) {
	db := testdb.NewMariaDB(t)
	logenginetest.HugeTransaction(t, func(pub broker.Publisher) logenginetest.Relay {
		r, err := binlog.New(db.URL, pub, fastConfig(t))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}, func() {
		db.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_version)
			SELECT UUID(), 'order', seq % 100, 'order.order.imported.v1',
				JSON_OBJECT('line', seq, 'note', REPEAT('x', 200)), seq DIV 100 + 1
			FROM seq_0_to_199999`)
	}, func() int { return db.Count(t, "outbox") })
}
