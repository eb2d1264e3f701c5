package mysql

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
)

// URLOptions adjust OpenURL.
type URLOptions struct {
	// Database, when set, is the database that holds the tables instead of
	// the URL's: created if it does not exist (utf8mb4, binary collation),
	// so that several applications (or services) share one server, each
	// in its own database. Empty: the URL's database.
	Database string
	// Tables names idem's tables. Tables.Schema defaults to Database.
	Tables idem.Tables
	// MaxConns caps the open connections. 0: no cap (database/sql's
	// default).
	MaxConns int
}

// OpenURL opens the MySQL or MariaDB database at rawURL,
// mysql://user:pass@host:3306/db?sslmode=verify-full&sslrootcert=ca.pem or
// mariadb://... (see ParseURL), checks that it answers, and returns the
// driver on it. Close its handle (driver.SQLDriver.DB) when done.
//
// It waits at most 15s for the database to be created and 10s for the
// first connection, less if ctx ends first.
func OpenURL(ctx context.Context, rawURL string, o URLOptions) (*driver.SQLDriver, error) {
	target, tables := rawURL, o.Tables
	if o.Database != "" {
		var err error
		if target, err = createDatabase(ctx, rawURL, o.Database); err != nil {
			return nil, err
		}
		if tables.Schema == "" {
			tables.Schema = o.Database
		}
	}
	db, err := Open(target)
	if err != nil {
		return nil, err
	}
	if o.MaxConns > 0 {
		db.SetMaxOpenConns(o.MaxConns)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("idem: mysql: connect: %w", err)
	}
	d, err := NewTables(db, tables)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return d, nil
}

// createDatabase creates the database name on the server of rawURL, if it
// does not exist, and returns rawURL with name as its database.
func createDatabase(ctx context.Context, rawURL, name string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // without the URL and its password
		}
		return "", fmt.Errorf("idem: mysql: URL: %w", err)
	}
	admin := *u
	admin.Path = "/"
	db, err := Open(admin.String())
	if err != nil {
		return "", err
	}
	defer func() { _ = db.Close() }()
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := db.ExecContext(cctx, "CREATE DATABASE IF NOT EXISTS "+QuoteIdent(name)+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		return "", fmt.Errorf("idem: mysql: create database %s: %w", name, err)
	}
	own := *u
	own.Path = "/" + name
	return own.String(), nil
}
