package sqlite

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// Path returns the database file of a sqlite: or file: URL: sqlite:PATH,
// sqlite:///abs/path, sqlite://rel/path, or file:PATH?params, which is
// returned whole (modernc.org/sqlite reads its parameters).
func Path(rawURL string) string {
	scheme, rest, _ := strings.Cut(rawURL, ":")
	if strings.EqualFold(scheme, "file") {
		return rawURL
	}
	return strings.TrimPrefix(rest, "//")
}

// URLOptions adjust OpenURL.
type URLOptions struct {
	// Tables names idem's tables. SQLite has no schemas: Tables.Schema
	// must be empty.
	Tables idem.Tables
	// MaxConns is the connection pool size, every connection kept open
	// with its prepared statements. 0 keeps Open's single connection.
	MaxConns int
}

// OpenURL opens the SQLite database of rawURL (see Path), created if it
// does not exist, checks that it answers, and returns the driver on it.
// Close its handle (driver.SQLDriver.DB) when done. Unless the URL has
// parameters, times are written as "2006-01-02 15:04:05.999999999-07:00"
// (_time_format=sqlite), always in UTC here, so that their text sorts like
// the times.
func OpenURL(ctx context.Context, rawURL string, o URLOptions) (*driver.SQLDriver, error) {
	dsn := Path(rawURL)
	if dsn == "" || dsn == "file:" {
		return nil, fmt.Errorf("idem: sqlite: URL %s: want sqlite:FILE", rawURL)
	}
	if !strings.Contains(dsn, "?") {
		dsn += "?_time_format=sqlite"
	}
	db, err := Open(dsn)
	if err != nil {
		return nil, err
	}
	if o.MaxConns > 0 {
		db.SetMaxOpenConns(o.MaxConns)
		db.SetMaxIdleConns(o.MaxConns)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("idem: sqlite: open %s: %w", Path(rawURL), err)
	}
	d, err := NewTables(db, o.Tables)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return d, nil
}
