package store

import "testing"

func TestQ(t *testing.T) {
	const insert = `INSERT INTO t (id, k, at) VALUES ($1, $2, $3)`
	const quoted = `SELECT '$1' || v FROM t WHERE id = $1 AND w = $2`
	for _, c := range []struct {
		dialect, query, want string
	}{
		{Postgres, insert, insert},
		{SQLite, insert, insert},
		{MySQL, insert, `INSERT INTO t (id, k, at) VALUES (?, ?, ?)`},
		{MySQL, quoted, `SELECT '$1' || v FROM t WHERE id = ? AND w = ?`},
		{MySQL, `UPDATE t SET a = $1, b = $2, c = $3, d = $4, e = $5, f = $6, g = $7, h = $8, i = $9, j = $10, k = $11`,
			`UPDATE t SET a = ?, b = ?, c = ?, d = ?, e = ?, f = ?, g = ?, h = ?, i = ?, j = ?, k = ?`},
		{MySQL, `SELECT count(*) FROM t`, `SELECT count(*) FROM t`},
	} {
		db := &DB{Dialect: c.dialect}
		if got := db.Q(c.query); got != c.want {
			t.Errorf("%s: Q(%q) = %q, want %q", c.dialect, c.query, got, c.want)
		}
	}
}

// MySQL takes its arguments in order: a query whose placeholders are not
// $1, $2... in order is wrong on every dialect, and Q says so.
func TestQPlaceholdersOutOfOrder(t *testing.T) {
	for _, q := range []string{
		`SELECT v FROM t WHERE a = $2 AND b = $1`,
		`SELECT v FROM t WHERE a = $1 OR b = $1`,
		`SELECT v FROM t WHERE a = $0`,
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Q(%q) on MySQL did not panic", q)
				}
			}()
			(&DB{Dialect: MySQL}).Q(q)
		}()
	}
}

func TestPick(t *testing.T) {
	byDialect := map[string]string{
		Postgres: `SELECT v FROM t WHERE id = $1 FOR UPDATE`,
		SQLite:   `SELECT v FROM t WHERE id = $1`,
	}
	for dialect, want := range map[string]string{
		Postgres: `SELECT v FROM t WHERE id = $1 FOR UPDATE`,
		MySQL:    `SELECT v FROM t WHERE id = ? FOR UPDATE`,
		SQLite:   `SELECT v FROM t WHERE id = $1`,
	} {
		if got := (&DB{Dialect: dialect}).Pick(byDialect); got != want {
			t.Errorf("%s: Pick = %q, want %q", dialect, got, want)
		}
	}
}
