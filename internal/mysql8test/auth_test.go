package mysql8test

import (
	"context"
	"database/sql"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"vitess.io/vitess/go/mysql"

	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/internal/testtls"
)

func dial(t *testing.T, cfg mysqlrepl.Config) (*mysqlrepl.Conn, error) {
	t.Helper()
	cfg.ServerID = 1_000_000 + rand.Uint32N(1<<30)
	cfg.DialTimeout = 10 * time.Second
	c, err := mysqlrepl.Dial(context.Background(), cfg)
	if err == nil {
		t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

// login dials s and runs a query, as the relay's replication connection
// does before its dump.
func login(t *testing.T, s *Server, cfg mysqlrepl.Config) error {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = s.Addr
	}
	cfg.User = s.User
	if cfg.Password == "" {
		cfg.Password = s.Password
	}
	c, err := dial(t, cfg)
	if err != nil {
		return err
	}
	if v := c.ServerVersion(); v != s.Version || c.MariaDB() {
		t.Errorf("server version %q (MariaDB %v)", v, c.MariaDB())
	}
	return c.Exec(context.Background(), "SELECT 1")
}

// TestCachingSHA2 logs in with caching_sha2_password as MySQL 8 asks for
// it. vitess's implementation of the plugin (its handshake, its
// AuthMoreData packets, its VerifyHashedCachingSha2Password check of the
// fast answer) serves TLS and the Unix socket: the first login is a full
// authentication (the password over the secure connection), which fills
// the cache, and the next one takes the fast path. On a plain TCP
// connection the stand-in's RSA exchange serves (vitess has none); that
// go-sql-driver, an independent client, logs in through it too shows it
// is MySQL's exchange and not only this client's idea of it.
func TestCachingSHA2(t *testing.T) {
	pki := testtls.New(t)
	s := Start(t, Plugins{Greeting: mysql.CachingSha2Password, SHA2: true}, pki.ServerConfig(t, false))

	for i := range 2 {
		if err := login(t, s, mysqlrepl.Config{TLS: pki.ClientConfig(t, false)}); err != nil {
			t.Fatalf("login %d over TLS: %v", i, err)
		}
		if full, _ := s.Auths(); full != 1 {
			t.Fatalf("after login %d over TLS: %d full authentications, want 1 (the first; then the fast path)", i, full)
		}
	}
	if err := login(t, s, mysqlrepl.Config{Network: "unix", Addr: s.Socket}); err != nil {
		t.Fatalf("login over the socket: %v", err)
	}
	err := login(t, s, mysqlrepl.Config{TLS: pki.ClientConfig(t, false), Password: "wrong"})
	var se *mysqlrepl.ServerError
	if !errors.As(err, &se) || se.Code != 1045 {
		t.Errorf("a wrong password over TLS: %v, want error 1045", err)
	}

	// Plain TCP, a fresh server: nothing cached.
	s = Start(t, Plugins{Greeting: mysql.CachingSha2Password, SHA2: true}, nil)
	err = login(t, s, mysqlrepl.Config{})
	if err == nil || !strings.Contains(err.Error(), "allowPublicKeyRetrieval=true") || strings.Contains(err.Error(), s.Password) {
		t.Fatalf("full authentication without TLS nor AllowPublicKeyRetrieval: %v", err)
	}
	if err := login(t, s, mysqlrepl.Config{AllowPublicKeyRetrieval: true}); err != nil {
		t.Fatalf("the RSA exchange: %v", err)
	}
	if _, rsaAuths := s.Auths(); rsaAuths != 1 {
		t.Fatalf("%d RSA exchanges, want 1", rsaAuths)
	}
	if err := login(t, s, mysqlrepl.Config{}); err != nil {
		t.Fatalf("the fast path once cached, without TLS: %v", err)
	}
	if err := login(t, s, mysqlrepl.Config{Password: "wrong", AllowPublicKeyRetrieval: true}); !errors.As(err, &se) || se.Code != 1045 {
		t.Errorf("a wrong password: %v, want error 1045", err)
	}

	s = Start(t, Plugins{Greeting: mysql.CachingSha2Password, SHA2: true}, nil)
	db, err := sql.Open("mysql", (&gomysql.Config{User: s.User, Passwd: s.Password, Net: "tcp", Addr: s.Addr,
		AllowNativePasswords: true}).FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Ping(); err != nil {
		t.Fatalf("go-sql-driver through the stand-in's RSA exchange: %v", err)
	}
	if _, rsaAuths := s.Auths(); rsaAuths != 1 {
		t.Fatalf("go-sql-driver logged in with %d RSA exchanges, want 1", rsaAuths)
	}
}

// TestNativeAndSwitch logs in with mysql_native_password (vitess's
// implementation and check), and follows the server's auth switch both
// ways: from a greeting naming mysql_native_password to
// caching_sha2_password, and the reverse.
func TestNativeAndSwitch(t *testing.T) {
	pki := testtls.New(t)
	for name, p := range map[string]Plugins{
		"native":              {Greeting: mysql.MysqlNativePassword, Native: true},
		"switch to sha2":      {Greeting: mysql.MysqlNativePassword, SHA2: true},
		"switch to native":    {Greeting: mysql.CachingSha2Password, Native: true},
		"native, sha2 greets": {Greeting: mysql.CachingSha2Password, Native: true, SHA2: false},
	} {
		s := Start(t, p, pki.ServerConfig(t, false))
		if err := login(t, s, mysqlrepl.Config{TLS: pki.ClientConfig(t, false)}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if err := login(t, s, mysqlrepl.Config{TLS: pki.ClientConfig(t, false), Password: "nope"}); err == nil {
			t.Errorf("%s: a wrong password logged in", name)
		}
	}
}
