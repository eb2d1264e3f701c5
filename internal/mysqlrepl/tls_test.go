package mysqlrepl_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/mysqlrepl"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testtls"
)

// TestTLS dials a MariaDB server of the test's own that has a certificate
// of a private CA and a user that must present a client certificate
// (REQUIRE X509). Over TLS with the client certificate the dump streams the
// rows of an insert, a 1 MiB one included (many TLS records per packet).
// The client refuses a server certificate of another CA, or one that does
// not name the server; the server refuses the user without a client
// certificate, and without TLS; and a server that does not offer TLS (the
// shared test server) is an error saying so.
func TestTLS(t *testing.T) {
	t.Parallel()
	pki := testtls.New(t)
	srv := testdb.StartMariaDBWith(t, testdb.MariaDBOptions{TLS: pki, Conf: testdb.SharedBinlog})
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := u.User.Password()
	cfg := mysqlrepl.Config{Addr: u.Host, User: u.User.Username(), Password: pw,
		ServerID: 1_000_000 + rand.Uint32N(1<<30), TLS: pki.ClientConfig(t, true)}

	db, err := mysql.Open(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	exec(t, db, "CREATE TABLE t (id INT PRIMARY KEY, b LONGBLOB)")
	pos := binlogPos(t, db)
	c := dial(t, cfg)
	if err := c.StartDump(ctx(t), pos); err != nil {
		t.Fatalf("StartDump over TLS: %v", err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16)
	exec(t, db, "INSERT INTO t VALUES (1, ?), (2, 'small')", big)
	groups, _ := readGroups(t, c, "idem_test", 1)
	var rows [][]any
	for _, e := range groups[0].rows {
		r, err := e.Rows()
		if err != nil {
			t.Fatalf("rows read over TLS: %v", err)
		}
		rows = append(rows, r...)
	}
	if len(rows) != 2 || !bytes.Equal(rows[0][1].([]byte), big) || string(rows[1][1].([]byte)) != "small" {
		t.Fatalf("%d rows read over TLS, want the 2 inserted", len(rows))
	}

	refused := func(what string, cfg mysqlrepl.Config, want string) {
		t.Helper()
		c, err := mysqlrepl.Dial(ctx(t), cfg)
		if err == nil {
			_ = c.Close()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", what, err, want)
		}
	}
	other := cfg
	other.TLS = testtls.New(t).ClientConfig(t, true)
	refused("another CA", other, "certificate signed by unknown authority")
	misnamed := cfg
	misnamed.TLS = pki.ClientConfig(t, true)
	misnamed.TLS.ServerName = "db.example"
	refused("another name", misnamed, "certificate is valid for localhost, not db.example")
	noCert := cfg
	noCert.TLS = pki.ClientConfig(t, false)
	refused("no client certificate", noCert, "Access denied for user 'idem'")
	plain := cfg
	plain.TLS = nil
	refused("no TLS", plain, "Access denied for user 'idem'")
	var se *mysqlrepl.ServerError
	if _, err := mysqlrepl.Dial(ctx(t), noCert); !errors.As(err, &se) || se.Code != 1045 {
		t.Errorf("no client certificate: %v, want the server's error 1045", err)
	}

	shared := config(t)
	shared.TLS = pki.ClientConfig(t, true)
	refused("a server without TLS", shared, "TLS was asked for, but the server")
}
