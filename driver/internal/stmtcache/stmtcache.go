// Package stmtcache keeps the prepared statements of each connection of a
// database/sql driver, so that a statement run again skips its parsing and
// planning: what pgx's statement cache does for PostgreSQL, for a driver
// that has none (modernc.org/sqlite, where parsing the relay's claim was
// half the CPU of an idle process).
//
// The cache sits between database/sql and the driver: NewConnector wraps a
// driver.Connector, and every connection it opens answers ExecContext and
// QueryContext with a statement prepared on that connection the first time
// its text was seen. Statements are kept per connection, the least recently
// used one is closed when the cache is full, and all of them when the
// connection closes. A statement whose rows are still open is not shared: a
// second query of the same text meanwhile runs uncached. Statements with
// many arguments (IN lists whose length varies from call to call) are not
// cached: each length would be a statement of its own.
package stmtcache

import (
	"container/list"
	"context"
	"database/sql/driver"
	"errors"
	"reflect"
	"sync"
)

// Defaults of Options.
const (
	// SizeDefault is how many statements a connection keeps.
	SizeDefault = 128
	// MaxArgsDefault is the most arguments of a cached statement.
	MaxArgsDefault = 64
)

// Options adjust NewConnector.
type Options struct {
	// Size is how many statements each connection keeps. Defaults to
	// SizeDefault.
	Size int
	// MaxArgs is the most arguments of a statement that is cached; a
	// statement with more runs uncached. Defaults to MaxArgsDefault.
	MaxArgs int
}

// NewConnector returns a connector whose connections are base's with a
// statement cache. base's connections must implement driver.ExecerContext,
// driver.QueryerContext and driver.ConnPrepareContext; a connection that
// does not runs uncached.
func NewConnector(base driver.Connector, opts Options) driver.Connector {
	if opts.Size <= 0 {
		opts.Size = SizeDefault
	}
	if opts.MaxArgs <= 0 {
		opts.MaxArgs = MaxArgsDefault
	}
	return &connector{base: base, opts: opts}
}

type connector struct {
	base driver.Connector
	opts Options
}

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	inner, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return newConn(inner, c.opts), nil
}

func (c *connector) Driver() driver.Driver { return c.base.Driver() }

// stmt is a cached statement.
type stmt struct {
	query string
	ds    driver.Stmt
	elem  *list.Element
	// busy: rows of the statement are open. evicted: it left the cache
	// while busy, and is closed when its rows are.
	busy, evicted bool
}

// conn is a connection with its cache. database/sql never uses a
// connection from two goroutines at once; mu covers the rows closed by
// database/sql's own goroutine when a query's context ends.
type conn struct {
	driver.Conn
	opts Options

	mu    sync.Mutex
	stmts map[string]*stmt
	lru   list.List // front: most recently used
}

func newConn(inner driver.Conn, opts Options) *conn {
	return &conn{Conn: inner, opts: opts, stmts: map[string]*stmt{}}
}

// Unwrap returns the driver's connection.
func (c *conn) Unwrap() driver.Conn { return c.Conn }

// Len returns the number of statements cached on dc, a connection of a
// cached connector (0 for any other), for tests through sql.Conn.Raw.
func Len(dc any) int {
	c, ok := dc.(*conn)
	if !ok {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.stmts)
}

// get returns the cached statement of query, prepared if needed and marked
// busy when forRows, or nil when query is not to be cached or its statement
// is busy.
func (c *conn) get(ctx context.Context, query string, nargs int, forRows bool) (*stmt, error) {
	if nargs > c.opts.MaxArgs {
		return nil, nil
	}
	prep, ok := c.Conn.(driver.ConnPrepareContext)
	if !ok {
		return nil, nil
	}
	c.mu.Lock()
	s := c.stmts[query]
	if s != nil {
		if s.busy {
			c.mu.Unlock()
			return nil, nil
		}
		c.lru.MoveToFront(s.elem)
		s.busy = forRows
		c.mu.Unlock()
		return s, nil
	}
	c.mu.Unlock()
	ds, err := prep.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if _, ok := ds.(driver.StmtExecContext); !ok {
		_ = ds.Close()
		return nil, nil
	}
	if _, ok := ds.(driver.StmtQueryContext); !ok {
		_ = ds.Close()
		return nil, nil
	}
	s = &stmt{query: query, ds: ds, busy: forRows}
	c.mu.Lock()
	defer c.mu.Unlock()
	s.elem = c.lru.PushFront(s)
	c.stmts[query] = s
	for c.lru.Len() > c.opts.Size {
		old := c.lru.Back().Value.(*stmt)
		c.lru.Remove(old.elem)
		delete(c.stmts, old.query)
		if old.busy {
			old.evicted = true
		} else {
			_ = old.ds.Close()
		}
	}
	return s, nil
}

// release ends the use of s by rows.
func (c *conn) release(s *stmt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s.busy = false
	if s.evicted {
		_ = s.ds.Close()
	}
}

// ExecContext implements driver.ExecerContext.
func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	s, err := c.get(ctx, query, len(args), false)
	if err != nil {
		return nil, err
	}
	if s == nil {
		if e, ok := c.Conn.(driver.ExecerContext); ok {
			return e.ExecContext(ctx, query, args)
		}
		return nil, driver.ErrSkip
	}
	return s.ds.(driver.StmtExecContext).ExecContext(ctx, args)
}

// QueryContext implements driver.QueryerContext.
func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	s, err := c.get(ctx, query, len(args), true)
	if err != nil {
		return nil, err
	}
	if s == nil {
		if q, ok := c.Conn.(driver.QueryerContext); ok {
			return q.QueryContext(ctx, query, args)
		}
		return nil, driver.ErrSkip
	}
	r, err := s.ds.(driver.StmtQueryContext).QueryContext(ctx, args)
	if err != nil {
		c.release(s)
		return nil, err
	}
	return &rows{Rows: r, release: func() { c.release(s) }}, nil
}

// Close closes the cached statements, then the connection.
func (c *conn) Close() error {
	c.mu.Lock()
	var errs []error
	for _, s := range c.stmts {
		errs = append(errs, s.ds.Close())
	}
	c.stmts = map[string]*stmt{}
	c.lru.Init()
	c.mu.Unlock()
	return errors.Join(append(errs, c.Conn.Close())...)
}

// PrepareContext implements driver.ConnPrepareContext: statements the
// application prepares itself are its own, not cached.
func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, query)
	}
	return c.Prepare(query)
}

// BeginTx implements driver.ConnBeginTx.
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	return c.Begin()
}

// Ping implements driver.Pinger.
func (c *conn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// ResetSession implements driver.SessionResetter.
func (c *conn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

// IsValid implements driver.Validator.
func (c *conn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// CheckNamedValue implements driver.NamedValueChecker.
func (c *conn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.Conn.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// rows are a cached statement's rows: closing them frees the statement.
type rows struct {
	driver.Rows
	release func()
	once    sync.Once
}

func (r *rows) Close() error {
	err := r.Rows.Close()
	r.once.Do(r.release)
	return err
}

// The optional interfaces of the driver's rows, forwarded.

func (r *rows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := r.Rows.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return t.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *rows) ColumnTypeLength(i int) (int64, bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypeLength); ok {
		return t.ColumnTypeLength(i)
	}
	return 0, false
}

func (r *rows) ColumnTypeNullable(i int) (bool, bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypeNullable); ok {
		return t.ColumnTypeNullable(i)
	}
	return false, false
}

func (r *rows) ColumnTypePrecisionScale(i int) (int64, int64, bool) {
	if t, ok := r.Rows.(driver.RowsColumnTypePrecisionScale); ok {
		return t.ColumnTypePrecisionScale(i)
	}
	return 0, 0, false
}

func (r *rows) ColumnTypeScanType(i int) reflect.Type {
	if t, ok := r.Rows.(driver.RowsColumnTypeScanType); ok {
		return t.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}

var (
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.Pinger             = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
)
