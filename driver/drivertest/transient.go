package drivertest

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testsvc"
)

// Transient checks the dialect's IsTransient: errors of statements that
// will fail again (a unique, NOT NULL or CHECK violation, a syntax error, a
// missing table) are not transient; connection errors, timeouts and a real
// deadlock between two transactions (on databases with row locks: all but
// those with Features.SingleWriter) are. The dialects' tests add what only their database can
// provoke (serialization failures, lock timeouts, a closed port, a busy
// SQLite database).
func Transient[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	ctx := testsvc.Ctx(t, time.Minute)
	d := db.Driver.Dialect()
	pool := db.Driver.Pool()

	t.Run("Permanent", func(t *testing.T) {
		db.exec(t, `CREATE TABLE checked (n INTEGER NOT NULL CHECK (n > 0))`)
		id := idem.NewEventID().String()
		db.exec(t, `INSERT INTO processed_event (consumer_name, event_id) VALUES ('stock', ?)`, id)
		for _, c := range []struct{ name, query string }{
			{"unique violation", `INSERT INTO processed_event (consumer_name, event_id) VALUES ('stock', '` + id + `')`},
			{"syntax error", `SELEC 1`},
			{"NOT NULL violation", `INSERT INTO failed_message (consumer_name, body, error) VALUES ('stock', NULL, 'boom')`},
			{"CHECK violation", `INSERT INTO checked (n) VALUES (0)`},
			{"missing table", `SELECT n FROM no_such_table`},
		} {
			_, err := pool.Exec(ctx, c.query)
			if err == nil {
				t.Errorf("%s: %s succeeded", c.name, c.query)
				continue
			}
			if d.IsTransient(err) {
				t.Errorf("%s (%v) is transient, want permanent", c.name, err)
			}
		}
		// Through the dialect's own operations too.
		dup := driver.Mark{ID: idem.NewEventID()}
		_, err := d.MarkProcessed(ctx, db.Driver.Pool(), "stock", []driver.Mark{dup})
		fatalIf(t, err, "mark")
		tx := db.begin(t, ctx)
		_, err = db.Driver.Tx(tx).Exec(ctx, db.bind(`INSERT INTO processed_event (consumer_name, event_id) VALUES ('stock', ?)`), dup.ID.String())
		if err == nil || d.IsTransient(err) {
			t.Errorf("duplicate marker in a transaction: err = %v, want a permanent error", err)
		}
	})

	t.Run("Classified", func(t *testing.T) {
		for _, c := range []struct {
			name string
			err  error
			want bool
		}{
			{"nil", nil, false},
			{"plain error", errors.New("no"), false},
			{"caller cancelled", fmt.Errorf("query: %w", context.Canceled), false},
			{"deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), true},
			{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
			{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
			{"broken pipe", fmt.Errorf("write: %w", syscall.EPIPE), true},
			{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
			{"bad connection", sqldriver.ErrBadConn, true},
			{"connection done", sql.ErrConnDone, true},
		} {
			if got := d.IsTransient(c.err); got != c.want {
				t.Errorf("IsTransient(%s: %v) = %v, want %v", c.name, c.err, got, c.want)
			}
		}
		// A real timeout: a query whose context expires while it waits
		// for a lock.
		if db.Features.SingleWriter {
			return
		}
		db.exec(t, `CREATE TABLE timed (id INTEGER NOT NULL PRIMARY KEY, n INTEGER NOT NULL)`)
		db.exec(t, `INSERT INTO timed (id, n) VALUES (1, 0)`)
		holder := db.begin(t, ctx)
		_, err := db.Driver.Tx(holder).Exec(ctx, `UPDATE timed SET n = 1 WHERE id = 1`)
		fatalIf(t, err, "lock the row")
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		_, err = pool.Exec(short, `UPDATE timed SET n = 2 WHERE id = 1`)
		if err == nil || !d.IsTransient(err) {
			t.Errorf("statement past its context deadline: err = %v, want a transient error", err)
		}
	})

	if db.Features.SingleWriter {
		return
	}
	t.Run("Deadlock", func(t *testing.T) {
		db.exec(t, `CREATE TABLE deadlocked (id INTEGER NOT NULL PRIMARY KEY, n INTEGER NOT NULL)`)
		db.exec(t, `INSERT INTO deadlocked (id, n) VALUES (1, 0), (2, 0)`)
		tx1, tx2 := db.Driver.Tx(db.begin(t, ctx)), db.Driver.Tx(db.begin(t, ctx))
		_, err := tx1.Exec(ctx, `UPDATE deadlocked SET n = 1 WHERE id = 1`)
		fatalIf(t, err, "first transaction locks row 1")
		_, err = tx2.Exec(ctx, `UPDATE deadlocked SET n = 2 WHERE id = 2`)
		fatalIf(t, err, "second transaction locks row 2")
		// The crossing updates deadlock whichever reaches the server first:
		// no need to wait for the first one to block.
		first := make(chan error, 1)
		go func() {
			_, err := tx1.Exec(ctx, `UPDATE deadlocked SET n = 1 WHERE id = 2`)
			first <- err
		}()
		_, err2 := tx2.Exec(ctx, `UPDATE deadlocked SET n = 2 WHERE id = 1`)
		err1 := <-first
		if (err1 == nil) == (err2 == nil) {
			t.Fatalf("errors = %v and %v, want one deadlock", err1, err2)
		}
		err = errors.Join(err1, err2)
		if !d.IsTransient(err) {
			t.Errorf("deadlock (%v) is not transient", err)
		}
	})
}
