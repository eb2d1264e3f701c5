package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/migrate"
	"github.com/idem-go/idem/outbox"
)

// TestWriterOnAnOlderSchema: a writer that neither delays events nor gives
// them a content type writes only the columns every schema has, so it goes
// on working on an outbox from before migrations 0012 (not_before) and
// 0014 (content_type, payload_binary): applications can be upgraded before
// the database. An event that needs a new column is refused by the
// database, not written without it.
func TestWriterOnAnOlderSchema(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	ctx := context.Background()
	if _, err := migrate.New(pg.Driver).Down(ctx, 11); err != nil {
		t.Fatal(err)
	}
	w := outbox.NewWriter(pg.Driver)
	plain, err := idem.NewEvent("order.order.placed.v1", "order", "1", map[string]int{"total": 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddExec(ctx, pg.Driver.Pool(), plain); err != nil {
		t.Fatalf("a plain event on the schema of migration 11: %v", err)
	}
	delayed, _ := idem.NewEvent("order.order.placed.v1", "order", "2", map[string]int{"total": 2})
	delayed.NotBefore = time.Now().Add(time.Hour)
	typed, _ := idem.NewEvent("order.order.placed.v1", "order", "3", nil)
	typed.ContentType, typed.Payload = "application/x-protobuf", []byte{0x08, 0x96, 0x01}
	for name, ev := range map[string]idem.Event{"delayed": delayed, "typed": typed} {
		if err := w.AddExec(ctx, pg.Driver.Pool(), ev); err == nil {
			t.Errorf("a %s event on the schema of migration 11 was written", name)
		}
	}
	if n := pg.Count(t, "outbox"); n != 1 {
		t.Errorf("%d rows, want the plain event's", n)
	}
	if _, err := migrate.New(pg.Driver).Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.AddExec(ctx, pg.Driver.Pool(), delayed, typed); err != nil {
		t.Fatalf("after migrating: %v", err)
	}
}
