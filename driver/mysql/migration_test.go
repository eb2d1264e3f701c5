package mysql_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/migrate"
)

// outboxTextIDs is the migration that widens the outbox's id column.
const outboxTextIDs = 10

// TestOutboxTextIDsMigration: migration 0010 lets the outbox take ids of up
// to 64 characters that are not UUIDs (refusing longer ones at insert);
// its down migration refuses, changing nothing, while such ids are in the
// outbox, and narrows the column back to CHAR(36) once they are gone.
func TestOutboxTextIDsMigration(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	insert := func(id string) error {
		_, err := db.DB.ExecContext(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES (?, 'order', ?, 'order.order.placed.v1', '{}')`, id, id)
		return err
	}
	column := func() string {
		t.Helper()
		var typ, charset, collation string
		if err := db.DB.QueryRowContext(ctx, `SELECT COLUMN_TYPE, CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'outbox' AND COLUMN_NAME = 'id'`, db.Name).Scan(&typ, &charset, &collation); err != nil {
			t.Fatal(err)
		}
		return typ + " " + charset + " " + collation
	}
	m := migrate.New(db.Driver)
	// down rolls back every version from outboxTextIDs on.
	down := func() error {
		t.Helper()
		st, err := m.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		steps := 0
		for _, s := range st {
			if s.Applied && s.Version >= outboxTextIDs {
				steps++
			}
		}
		_, err = m.Down(ctx, steps)
		return err
	}

	if got := column(); got != "varchar(64) utf8mb4 utf8mb4_bin" {
		t.Fatalf("outbox id column: %s, want varchar(64) utf8mb4 utf8mb4_bin", got)
	}
	long := strings.Repeat("x", 64)
	for _, id := range []string{"E42", long, strings.Repeat("\u00e9", 33)} {
		if err := insert(id); err != nil {
			t.Fatalf("insert id %q: %v", id, err)
		}
	}
	var me *gomysql.MySQLError
	if err := insert(strings.Repeat("x", 65)); !errors.As(err, &me) || me.Number != 1406 { // ER_DATA_TOO_LONG
		t.Fatalf("insert of a 65-character id: %v, want error 1406 (data too long)", err)
	}
	// "e42" is another id than "E42": the column compares bytes.
	if err := insert("e42"); err != nil {
		t.Fatalf("insert e42 beside E42: %v", err)
	}

	err := down()
	if err == nil || !strings.Contains(err.Error(), "outbox_ids_must_be_uuids") {
		t.Fatalf("down with ids that are not UUIDs in the outbox: %v, want a refusal naming the check outbox_ids_must_be_uuids", err)
	}
	if got := column(); got != "varchar(64) utf8mb4 utf8mb4_bin" {
		t.Fatalf("after the refused down, outbox id column: %s", got)
	}
	var n int
	if err := db.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbox`).Scan(&n); err != nil || n != 4 {
		t.Fatalf("after the refused down, %d rows (%v), want the 4 rows", n, err)
	}
	// A UUID in capitals is a UUID.
	if err := insert(strings.ToUpper("0193a0e4-5b7c-7d7e-8f90-a1b2c3d4e5f6")); err != nil {
		t.Fatal(err)
	}
	if err := down(); err == nil || !strings.Contains(err.Error(), "outbox_ids_must_be_uuids") {
		t.Fatalf("down again: %v, want the same refusal", err)
	}
	if _, err := db.DB.ExecContext(ctx, `DELETE FROM outbox WHERE id IN ('E42', 'e42', ?, ?)`, long, strings.Repeat("\u00e9", 33)); err != nil {
		t.Fatal(err)
	}
	if err := down(); err != nil {
		t.Fatalf("down once the long ids are gone: %v", err)
	}
	if got := column(); got != "char(36) ascii ascii_general_ci" {
		t.Fatalf("after down, outbox id column: %s, want char(36) ascii", got)
	}
	if err := insert(strings.Repeat("x", 37)); !errors.As(err, &me) || me.Number != 1406 {
		t.Fatalf("after down, insert of a 37-character id: %v, want error 1406", err)
	}
	var constraints int
	if err := db.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.TABLE_CONSTRAINTS
WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = 'outbox' AND CONSTRAINT_NAME = 'outbox_ids_must_be_uuids'`, db.Name).Scan(&constraints); err != nil || constraints != 0 {
		t.Fatalf("after down, %d checks outbox_ids_must_be_uuids left (%v), want none", constraints, err)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if got := column(); got != "varchar(64) utf8mb4 utf8mb4_bin" {
		t.Fatalf("after up again, outbox id column: %s", got)
	}
	if err := insert(long); err != nil {
		t.Fatalf("after up again, insert of a 64-character id: %v", err)
	}
}
