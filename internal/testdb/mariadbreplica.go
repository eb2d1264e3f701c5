package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/driver/mysql"
)

// StartReplica starts a MariaDB server of the test's own replicating s, a
// server started with a binlog (SharedBinlog's settings): GTID replication
// (CHANGE MASTER TO ... MASTER_USE_GTID = slave_pos) from s's position at
// the call, so that each server keeps its own user idem and database
// idem_test, and what s writes after the call reaches the replica. The
// replica logs what it applies (log_slave_updates = ON), so that a reader
// of s's binlog finds its GTID position in the replica's binlog once it is
// promoted; it has a binlog of its own in row format, a random server_id
// below 2^29 (the relays' are above 2^30), and read_only = ON until
// Promote.
//
// With Async, s commits without waiting for the replica: a failover loses
// what the replica had not received. With Sync, replication is
// semi-synchronous (built into MariaDB 10.3+): s's rpl_semi_sync_master_*
// are set (enabled, wait point AFTER_SYNC, a timeout of 10 minutes so that
// it never falls back to asynchronous in a test), the replica's
// rpl_semi_sync_slave_enabled, and StartReplica returns once s counts the
// replica as a semi-synchronous client. A commit then returns, and its
// rows become visible to other sessions, only once the replica has the
// transaction.
func (s *MariaDBServer) StartReplica(t testing.TB, mode Replication) *MariaDBServer {
	t.Helper()
	conf := []string{fmt.Sprintf("server_id = %d", 2+rand.IntN(1<<29)), "log_bin = mariadb-bin", "binlog_format = ROW",
		"binlog_row_image = FULL", "binlog_row_metadata = FULL", "log_slave_updates = ON", "read_only = ON"}
	if mode == Sync {
		conf = append(conf, "rpl_semi_sync_slave_enabled = ON")
	}
	r := StartMariaDBWith(t, MariaDBOptions{Conf: conf, unlogged: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if mode == Sync {
		s.Exec(t, "SET GLOBAL rpl_semi_sync_master_enabled = ON")
		s.Exec(t, "SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC")
		s.Exec(t, "SET GLOBAL rpl_semi_sync_master_timeout = 600000")
	}
	var pos string
	s.scan(t, ctx, "SELECT @@gtid_binlog_pos", nil, &pos)
	r.Exec(t, "SET GLOBAL gtid_slave_pos = ?", pos)
	r.Exec(t, fmt.Sprintf("CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = %d, MASTER_USER = 'idem', MASTER_PASSWORD = 'idem', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1", s.Port))
	r.Exec(t, "START SLAVE")
	for {
		st := r.slaveStatus(t, ctx)
		io, sqlThread := st["Slave_IO_Running"], st["Slave_SQL_Running"]
		clients := "1"
		if mode == Sync {
			var name string
			s.scan(t, ctx, "SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_master_clients'", nil, &name, &clients)
		}
		if io == "Yes" && sqlThread == "Yes" && clients != "0" {
			return r
		}
		select {
		case <-ctx.Done():
			t.Fatalf("replica on port %d: IO thread %s, SQL thread %s, semi-sync clients of the primary %s", r.Port, io, sqlThread, clients)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// slaveStatus returns the row of SHOW SLAVE STATUS, by column.
func (s *MariaDBServer) slaveStatus(t testing.TB, ctx context.Context) map[string]string {
	t.Helper()
	db := s.open(t)
	defer db.Close()
	rows, err := db.QueryContext(ctx, "SHOW SLAVE STATUS")
	if err != nil {
		t.Fatalf("SHOW SLAVE STATUS: %v", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil || !rows.Next() {
		t.Fatalf("SHOW SLAVE STATUS: no row (%v)", err)
	}
	vals := make([]sql.NullString, len(cols))
	dest := make([]any, len(cols))
	for i := range vals {
		dest[i] = &vals[i]
	}
	if err := rows.Scan(dest...); err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(cols))
	for i, c := range cols {
		out[c] = vals[i].String
	}
	return out
}

// Kill ends the server's process with SIGKILL, as a crash would, and waits
// for it to end.
func (s *MariaDBServer) Kill(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill the MariaDB server on port %d: %v", s.Port, err)
	}
	<-s.exited
}

// Promote makes a replica the primary, as an operator does once its
// primary is dead: the IO thread stopped, the transactions it received
// applied (MASTER_GTID_WAIT on Gtid_IO_Pos: RESET SLAVE ALL deletes the
// relay log, and with it what was received but not applied, which
// semi-synchronous replication has acknowledged), then STOP SLAVE, RESET
// SLAVE ALL (it forgets its primary) and read_only = OFF.
func (s *MariaDBServer) Promote(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 70*time.Second)
	defer cancel()
	s.Exec(t, "STOP SLAVE IO_THREAD")
	st := s.slaveStatus(t, ctx)
	if received := st["Gtid_IO_Pos"]; received != "" && st["Slave_SQL_Running"] == "Yes" {
		var got int
		s.scan(t, ctx, "SELECT MASTER_GTID_WAIT(?, 60)", []any{received}, &got)
		if got != 0 {
			t.Fatalf("the replica on port %d did not apply what it received (%s) in 60 s", s.Port, received)
		}
	}
	for _, q := range []string{"STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF"} {
		s.Exec(t, q)
	}
}

// PauseReplication stops the replica's IO thread (STOP SLAVE IO_THREAD):
// what s writes from then on is the tail a failover to the replica loses.
// The replica still applies what it had received.
func (s *MariaDBServer) PauseReplication(t testing.TB, replica *MariaDBServer) {
	t.Helper()
	replica.Exec(t, "STOP SLAVE IO_THREAD")
}

// ReplicatedAll waits until the replica has applied every transaction of
// s's binlog (MASTER_GTID_WAIT on s's gtid_binlog_pos).
func (s *MariaDBServer) ReplicatedAll(t testing.TB, replica *MariaDBServer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 70*time.Second)
	defer cancel()
	var pos string
	s.scan(t, ctx, "SELECT @@gtid_binlog_pos", nil, &pos)
	var got int
	replica.scan(t, ctx, "SELECT MASTER_GTID_WAIT(?, 60)", []any{pos}, &got)
	if got != 0 {
		t.Fatalf("the replica on port %d did not reach the primary's position %s in 60 s", replica.Port, pos)
	}
}

// Exec runs a statement on the server's idem_test database, as the user
// idem, or fails the test.
func (s *MariaDBServer) Exec(t testing.TB, query string, args ...any) {
	t.Helper()
	db := s.open(t)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("MariaDB on port %d: %s: %v", s.Port, query, err)
	}
}

// scan reads one row of query, with args, into dest, or fails the test.
func (s *MariaDBServer) scan(t testing.TB, ctx context.Context, query string, args []any, dest ...any) {
	t.Helper()
	db := s.open(t)
	defer db.Close()
	if err := db.QueryRowContext(ctx, query, args...).Scan(dest...); err != nil {
		t.Fatalf("MariaDB on port %d: %s: %v", s.Port, query, err)
	}
}

func (s *MariaDBServer) open(t testing.TB) *sql.DB {
	t.Helper()
	db, err := mysql.Open(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// Unreceived returns how many transactions of s's binlog the replica has
// not received: the sequence number of s's gtid_binlog_pos less that of
// the replica's Gtid_IO_Pos, in replication domain 0 (the only one the
// test servers use).
func (s *MariaDBServer) Unreceived(t testing.TB, replica *MariaDBServer) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var pos string
	s.scan(t, ctx, "SELECT @@gtid_binlog_pos", nil, &pos)
	return seqNo(t, pos) - seqNo(t, replica.slaveStatus(t, ctx)["Gtid_IO_Pos"])
}

// seqNo returns the sequence number of domain 0 in a GTID position
// ("0-1-42"), 0 for none.
func seqNo(t testing.TB, pos string) int64 {
	t.Helper()
	for _, g := range strings.Split(pos, ",") {
		parts := strings.Split(strings.TrimSpace(g), "-")
		if len(parts) == 3 && parts[0] == "0" {
			n, err := strconv.ParseInt(parts[2], 10, 64)
			if err != nil {
				t.Fatalf("GTID position %q: %v", pos, err)
			}
			return n
		}
	}
	return 0
}
