package cdc_test

import (
	"testing"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/relay/cdc"
	"github.com/idem-go/idem/relay/internal/logengine/logenginetest"
)

// TestHugeTransaction: one transaction of a backfill's size, relayed in
// bounded memory (logenginetest.HugeTransaction).
func TestHugeTransaction(t *testing.T) {
	pg := newDB(t)
	logenginetest.HugeTransaction(t, func(pub broker.Publisher) logenginetest.Relay {
		cfg := fastConfig(t)
		cfg.Tables.Schema, cfg.MessagePrefix = pg.Schema, pg.Schema
		r, err := cdc.New(pg.URL, pub, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}, func() {
		pg.Exec(t, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_version)
			SELECT gen_random_uuid(), 'order', (g % 100)::text, 'order.order.imported.v1',
				jsonb_build_object('line', g, 'note', repeat('x', 200)), g / 100 + 1
			FROM generate_series(0, $1 - 1) g`, logenginetest.HugeRows)
	}, func() int { return pg.Count(t, "outbox") })
}
