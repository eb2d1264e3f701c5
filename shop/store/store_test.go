package store

import "testing"

func TestQ(t *testing.T) {
	const insert = `INSERT INTO t (id, k, at) VALUES ($1, $2, $3) ON CONFLICT (k) DO NOTHING`
	const lock = `SELECT v FROM t WHERE id = $1 FOR UPDATE`
	for _, c := range []struct {
		dialect, query, want string
	}{
		{Postgres, insert, insert},
		{MySQL, insert, `INSERT INTO t (id, k, at) VALUES (?, ?, ?) ON DUPLICATE KEY UPDATE k = k`},
		{SQLite, insert, `INSERT INTO t (id, k, at) VALUES (?1, ?2, ?3) ON CONFLICT (k) DO NOTHING`},
		{MySQL, lock, `SELECT v FROM t WHERE id = ? FOR UPDATE`},
		{SQLite, lock, `SELECT v FROM t WHERE id = ?1`},
	} {
		db := &DB{Dialect: c.dialect}
		for range 2 { // the second call reads the cache
			if got := db.Q(c.query); got != c.want {
				t.Errorf("%s: Q(%q) = %q, want %q", c.dialect, c.query, got, c.want)
			}
		}
	}
}
