// Package shopkit runs the reference shop (cmd/shop) as separate processes
// and checks its databases: what the shop's end-to-end tests and the shopctl
// tool (crash table, random kills, load) share.
//
// A Cluster starts shop processes of one namespace on shared servers,
// kills, freezes and stops them, and tells which died on their own;
// PlaceOrder and its kin talk to the order API; an Inspector reads every
// service's database and checks the shop's invariants: each committed
// order has exactly one reservation per line, one preparation, one pickup
// at the carrier, one invoice and one e-mail, a cancelled one is
// compensated everywhere, nothing exists for an order never committed,
// and, from the consumers' application ledgers (store.DB.RecordApplications),
// every event of every outbox was applied exactly once by each consumer
// subscribed to it, in aggregate-version order. ScanLogs reads the
// processes' logs (race reports, events met before their row was visible);
// a DBServer is a database server of a run's own that a chaos run crashes,
// freezes and holds.
package shopkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"path/filepath"
	"time"

	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/shop/store"
)

// The values of the shop's flags that the tools set.
const (
	// NamespaceDefault is the shop's default --namespace.
	NamespaceDefault = "shop"
	// RelayPoll and RelayCDC are the values of --relay: the polling relay
	// (every database) and the CDC relay (PostgreSQL).
	RelayPoll, RelayCDC = "poll", "cdc"
	// OutboxRows and OutboxLog are the values of --outbox: outbox rows, or
	// WAL messages (with --relay cdc).
	OutboxRows, OutboxLog = "rows", "log"
)

// databases lists the shop's services that own a database.
var databases = []string{"order", "stock", "shipping", "billing", "carrier"}

// SettleTimeout bounds the wait for every effect of the orders placed,
// after a recovery, the sentinel order's included (Inspector.Settle).
const SettleTimeout = 90 * time.Second

// Check is one row of a verdict.
type Check struct {
	// What is the invariant checked.
	What string
	// Observed is what was found.
	Observed string
	// OK is set when the invariant holds.
	OK bool
	// NotRun is set when the check could not run (what it needs is
	// missing): neither a pass nor a failure, and Observed says why.
	NotRun bool
}

// RandomSuffix returns 8 random hexadecimal digits, to name a namespace of
// its own.
func RandomSuffix() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// DropNamespace removes the schemas (PostgreSQL) or databases (MySQL) of
// the inspector's namespace, and on PostgreSQL the replication slots and
// publications of its CDC relays: a slot left behind would keep the
// server's WAL forever. The namespace's processes must have stopped. SQLite
// files stay in their directory, which the caller removes.
func (in *Inspector) DropNamespace() {
	for _, db := range in.DBs {
		switch db.Dialect {
		case store.Postgres:
			dropSlot(db)
			_, _ = db.SQL.Exec(`DROP SCHEMA IF EXISTS ` + db.Schema + ` CASCADE`)
		case store.MySQL:
			_, _ = db.SQL.Exec("DROP DATABASE IF EXISTS `" + db.Schema + "`")
		}
	}
}

// dropSlot drops the CDC slot of db's service, waiting a few seconds for
// the server to notice that a relay which just exited is gone (its slot is
// active until then).
func dropSlot(db *store.DB) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := db.DropCDCSlot(ctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// StartEmbedded returns the --db and --broker of shop processes that share
// the embedded defaults: SQLite files under dir, and a NATS JetStream
// server run by this process (a process that may be killed cannot own it)
// with its data under dir, listening on a free local port. stop stops the
// server.
func StartEmbedded(ctx context.Context, dir string) (db, brokerURL string, stop func(), err error) {
	srv, err := embedded.Start(ctx, embedded.Config{Dir: filepath.Join(dir, "nats"), Listen: "127.0.0.1:0"})
	if err != nil {
		return "", "", nil, err
	}
	// A short ack_wait has a killed consumer's messages delivered again soon.
	return "sqlite:" + filepath.Join(dir, "db"), srv.ClientURL() + "?ack_wait=3s", func() { _ = srv.Shutdown(context.Background()) }, nil
}
