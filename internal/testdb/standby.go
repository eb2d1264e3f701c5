package testdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/internal/procstat"
)

// Replication says how a standby made by StartStandby follows its primary.
type Replication int

const (
	// Async is PostgreSQL's default streaming replication: the primary
	// acknowledges a commit once it is flushed on its own disk, and the
	// standby receives it afterwards. A failover loses what the standby
	// had not received.
	Async Replication = iota
	// Sync makes the standby the primary's synchronous standby
	// (synchronous_standby_names, synchronous_commit = on): the primary
	// acknowledges a commit only once the standby flushed it. A failover
	// loses nothing that was acknowledged.
	Sync
)

// StartStandby makes a streaming standby of s: a base backup of s
// (pg_basebackup -R) in a data directory of its own, on its own port,
// started and streaming from s, with the application name
// "standby_<port>". With Sync, s is configured (ALTER SYSTEM, reload) to
// wait for it at each commit, and StartStandby returns once s reports it
// synchronous. The standby is stopped and removed when the test ends.
func (s *Server) StartStandby(t testing.TB, mode Replication) *Server {
	t.Helper()
	st := newServer(t, s.bin, "pg-standby-")
	var err error
	if st.Port, err = freePort(); err != nil {
		t.Fatal(err)
	}
	st.Name = fmt.Sprintf("standby_%d", st.Port)
	if out, err := st.command("pg_basebackup", "-D", st.data, "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", "postgres",
		"-R", "-X", "stream", "-c", "fast", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	// pg_basebackup copied s's settings: a port and socket of its own, and
	// its name in the primary's pg_stat_replication. The last setting of a
	// file wins: the primary_conninfo written here replaces the one -R wrote.
	appendConf(t, filepath.Join(st.data, "postgresql.conf"), "the standby (internal/testdb)", []string{
		fmt.Sprintf("port = %d", st.Port),
		fmt.Sprintf("unix_socket_directories = '%s'", st.dir),
		"hot_standby = on",
	})
	appendConf(t, filepath.Join(st.data, "postgresql.auto.conf"), "the standby (internal/testdb)", []string{
		fmt.Sprintf("primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=%s'", s.Port, st.Name),
	})
	st.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", st.Port)
	st.Start(t)
	if mode == Sync {
		s.Exec(t, fmt.Sprintf(`ALTER SYSTEM SET synchronous_standby_names = '"%s"'`, st.Name))
		s.Exec(t, `ALTER SYSTEM SET synchronous_commit = 'on'`)
		s.Exec(t, `SELECT pg_reload_conf()`)
	}
	want := "async"
	if mode == Sync {
		want = "sync"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		var state string
		err := s.scan(ctx, `SELECT coalesce(state, '') || '/' || coalesce(sync_state, '') FROM pg_stat_replication WHERE application_name = $1`, []any{st.Name}, &state)
		if err == nil && state == "streaming/"+want {
			return st
		}
		if ctx.Err() != nil {
			t.Fatalf("standby %s does not stream from the primary as %s: state %q, %v", st.Name, want, state, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Promote promotes a standby (pg_ctl promote) and waits until it accepts
// writes.
func (s *Server) Promote(t testing.TB) {
	t.Helper()
	if out, err := s.command("pg_ctl", "-D", s.data, "-w", "-t", "60", "-s", "promote").CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl promote: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		var recovering bool
		err := s.scan(ctx, `SELECT pg_is_in_recovery()`, nil, &recovering)
		if err == nil && !recovering {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("standby on port %d still in recovery after promotion: %v", s.Port, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill kills the server and every one of its processes with SIGKILL, as a
// crash of its machine would, and returns once they are gone. Its data
// directory stays as the crash left it.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	pids := s.signalAll(t, syscall.SIGKILL)
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range pids {
		for !dead(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d of the server on port %d survived SIGKILL", pid, s.Port)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// dead reports whether a process is gone, or a zombie waiting for its
// parent.
func dead(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return true
	}
	rest := string(b)
	if k := strings.LastIndexByte(rest, ')'); k >= 0 {
		rest = rest[k+1:]
	}
	f := strings.Fields(rest)
	return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}

// Freeze stops (SIGSTOP) the server and every one of its processes, as a
// server that hangs or a network partition looks to its clients: their
// connections stay open and nothing answers (the kernel still accepts new
// connections, which then wait). They are continued when the test ends.
func (s *Server) Freeze(t testing.TB) {
	t.Helper()
	pids := s.signalAll(t, syscall.SIGSTOP)
	for _, pid := range pids {
		if err := procstat.WaitStopped(pid, 30*time.Second); err != nil && !errors.Is(err, procstat.ErrNoProcess) {
			t.Fatalf("freeze the server on port %d: %v", s.Port, err)
		}
	}
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
	})
}

// signalAll sends sig to the postmaster and to each of its children (each
// backend runs in a session of its own: the postmaster's process group does
// not hold them). The postmaster is stopped first, so that it forks no
// child meanwhile. It returns the pids, the postmaster's first.
func (s *Server) signalAll(t testing.TB, sig syscall.Signal) []int {
	t.Helper()
	pm := s.postmasterPID(t)
	if err := syscall.Kill(pm, syscall.SIGSTOP); err != nil {
		t.Fatalf("stop the postmaster of the server on port %d (pid %d): %v", s.Port, pm, err)
	}
	pids := []int{pm}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, not ')'.
		rest := string(b)
		if k := strings.LastIndexByte(rest, ')'); k >= 0 {
			rest = rest[k+1:]
		}
		if f := strings.Fields(rest); len(f) > 1 && f[1] == strconv.Itoa(pm) {
			pids = append(pids, pid)
		}
	}
	for _, pid := range pids[1:] {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("signal %v to process %d of the server on port %d: %v", sig, pid, s.Port, err)
		}
	}
	if err := syscall.Kill(pm, sig); err != nil {
		t.Fatalf("signal %v to the postmaster of the server on port %d (pid %d): %v", sig, s.Port, pm, err)
	}
	return pids
}

// postmasterPID reads the server's postmaster.pid.
func (s *Server) postmasterPID(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.data, "postmaster.pid"))
	if err != nil {
		t.Fatalf("server on port %d: %v", s.Port, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		t.Fatalf("server on port %d: postmaster.pid: %v", s.Port, err)
	}
	return pid
}

// MultiHostURL returns a URL for database db (postgres when empty) listing
// the servers' hosts in order, with target_session_attrs=read-write: a
// client connects to the first that accepts writes, the primary, and
// after a failover to the promoted standby.
func MultiHostURL(db string, servers ...*Server) string {
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", s.Port)
	}
	if db == "" {
		db = "postgres"
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=5", strings.Join(hosts, ","), db)
}

// Exec runs statements on the server's postgres database, as the superuser.
func (s *Server) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatalf("server on port %d: %v", s.Port, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("server on port %d: %s: %v", s.Port, sql, err)
	}
}

// scan reads one row of a query into dest, on a connection of its own.
func (s *Server) scan(ctx context.Context, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// PauseReplication stops (SIGSTOP) the walsender of s that streams to
// standby: the standby receives nothing more, and what s commits from then
// on exists on s alone (s goes on acknowledging commits when the standby is
// asynchronous). Kill s then, and that is the tail a failover to an
// asynchronous standby loses. Call it once the standby has what it must
// keep (ReplayedAll).
func (s *Server) PauseReplication(t testing.TB, standby *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var pid int32
	if err := s.scan(ctx, `SELECT pid FROM pg_stat_replication WHERE application_name = $1`, []any{standby.Name}, &pid); err != nil {
		t.Fatalf("the walsender of %s: %v", standby.Name, err)
	}
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		t.Fatalf("stop the walsender of %s (pid %d): %v", standby.Name, pid, err)
	}
}

// ReplayedAll waits until standby has replayed everything s wrote until
// now.
func (s *Server) ReplayedAll(t testing.TB, standby *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var lsn string
	if err := s.scan(ctx, `SELECT pg_current_wal_lsn()::text`, nil, &lsn); err != nil {
		t.Fatal(err)
	}
	for {
		var ok bool
		err := standby.scan(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)`, []any{lsn}, &ok)
		if err == nil && ok {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("standby %s has not replayed %s: %v", standby.Name, lsn, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
