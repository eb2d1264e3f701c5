package shopkit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/ctxsleep"
	"github.com/idem-go/idem/internal/procstat"

	// The pgx database/sql driver, "pgx".
	_ "github.com/jackc/pgx/v5/stdlib"
)

// DBServer is a database server of a chaos run's own, on this machine,
// that the run faults: it kills it with SIGKILL (the server process and
// every process it started) and starts it again, freezes it (SIGSTOP,
// then SIGCONT) or holds its commits. Never give it a server that others
// use: its faults are theirs too.
type DBServer struct {
	// URL connects to the server as a user who may read its data
	// directory's settings and change its global settings (PostgreSQL's
	// superuser, MariaDB's root or an account with SUPER).
	URL string
	// Start is the command that starts the server again with its data
	// and waits until it serves, such as the script make test writes
	// (IDEM_TEST_POSTGRES_START) or pg_ctl start -w.
	Start []string

	mu     sync.Mutex
	frozen []int
}

// Name is "postgres" or "mariadb".
func (s *DBServer) Name() string {
	if isPostgres(s.URL) {
		return "postgres"
	}
	return "mariadb"
}

func isPostgres(rawURL string) bool {
	scheme, _, _ := strings.Cut(strings.ToLower(rawURL), "://")
	return scheme == "postgres" || scheme == "postgresql"
}

// open connects to the server.
func (s *DBServer) open() (*sql.DB, error) {
	if isPostgres(s.URL) {
		return sql.Open("pgx", s.URL)
	}
	return mysql.Open(s.URL)
}

// pids returns the server's processes: PostgreSQL's postmaster (read from
// postmaster.pid in its data directory) and its children, MariaDB's
// mariadbd (read from its pid file).
func (s *DBServer) pids(ctx context.Context) ([]int, error) {
	db, err := s.open()
	if err != nil {
		return nil, err
	}
	defer db.Close()
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var path string
	if isPostgres(s.URL) {
		var dir string
		if err := db.QueryRowContext(qctx, `SELECT current_setting('data_directory')`).Scan(&dir); err != nil {
			return nil, fmt.Errorf("%s: its data directory: %w", broker.RedactURL(s.URL), err)
		}
		path = filepath.Join(dir, "postmaster.pid")
	} else {
		var dir string
		if err := db.QueryRowContext(qctx, `SELECT @@pid_file, @@datadir`).Scan(&path, &dir); err != nil {
			return nil, fmt.Errorf("%s: its pid file: %w", broker.RedactURL(s.URL), err)
		}
		if !filepath.IsAbs(path) {
			path = filepath.Join(dir, path)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the server's pid file (it must run on this machine): %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		return nil, fmt.Errorf("the server's pid file %s: %q is no pid", path, first)
	}
	out := []int{pid}
	for _, p := range procstat.All() {
		if p.PPID == pid {
			out = append(out, p.PID)
		}
	}
	return out, nil
}

// Crash kills the server's processes with SIGKILL and starts it again: a
// crash, recovered from its log at the start. It returns once the server
// serves again.
func (s *DBServer) Crash(ctx context.Context) (string, error) {
	pids, err := s.pids(ctx)
	if err != nil {
		return "", err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, pid := range pids {
		for {
			if _, err := procstat.Read(pid); errors.Is(err, procstat.ErrNoProcess) {
				break
			}
			if time.Now().After(deadline) {
				return "", fmt.Errorf("process %d of the server still there 30s after SIGKILL", pid)
			}
			ctxsleep.Sleep(ctx, 20*time.Millisecond)
		}
	}
	if len(s.Start) == 0 {
		return "", errors.New("no command to start the server again")
	}
	out, err := exec.CommandContext(ctx, s.Start[0], s.Start[1:]...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("start the server again (%s): %w\n%s", strings.Join(s.Start, " "), err, out)
	}
	return fmt.Sprintf("%d processes killed, started again", len(pids)), s.waitServing(ctx)
}

// waitServing waits, 60 s at most, until the server answers a query.
func (s *DBServer) waitServing(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		db, err := s.open()
		if err == nil {
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = db.PingContext(qctx)
			cancel()
			db.Close()
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server does not answer 60s after its start: %w", err)
		}
		if !ctxsleep.Sleep(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// Freeze stops the server's processes with SIGSTOP: its clients' queries
// and commits hang, its connections stay open.
func (s *DBServer) Freeze() error {
	pids, err := s.pids(context.Background())
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.frozen = pids
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	return nil
}

// Thaw resumes the processes Freeze stopped.
func (s *DBServer) Thaw() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pid := range slices.Backward(s.frozen) {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	s.frozen = nil
	return nil
}

// HoldCommits holds every commit for d after its log record is flushed,
// the moment a CDC relay may read it and before other sessions see it:
// PostgreSQL waits that long for a synchronous standby that never answers
// (synchronous_standby_names set, then reset and the waits released);
// MariaDB for a semi-synchronous replica, after the binary log is synced
// and before the storage engine commits (rpl_semi_sync_master_wait_point
// AFTER_SYNC, with d as its timeout). A relay that publishes a
// transaction before it is visible (G13) does it then.
func (s *DBServer) HoldCommits(ctx context.Context, d time.Duration) (string, error) {
	db, err := s.open()
	if err != nil {
		return "", err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	exec := func(stmts ...string) error {
		for _, q := range stmts {
			qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_, err := db.ExecContext(qctx, q)
			cancel()
			if err != nil {
				return fmt.Errorf("%s: %w", q, err)
			}
		}
		return nil
	}
	if isPostgres(s.URL) {
		if err := exec(`ALTER SYSTEM SET synchronous_standby_names = 'idem_chaos_absent_standby'`, `SELECT pg_reload_conf()`); err != nil {
			return "", err
		}
		ctxsleep.Sleep(ctx, d)
		return "commits held by a synchronous standby that never answers", exec(`ALTER SYSTEM RESET synchronous_standby_names`, `SELECT pg_reload_conf()`)
	}
	if err := exec(`SET GLOBAL rpl_semi_sync_master_wait_point = AFTER_SYNC`, `SET GLOBAL rpl_semi_sync_master_wait_no_slave = ON`,
		fmt.Sprintf(`SET GLOBAL rpl_semi_sync_master_timeout = %d`, d.Milliseconds()), `SET GLOBAL rpl_semi_sync_master_enabled = ON`); err != nil {
		return "", err
	}
	ctxsleep.Sleep(ctx, d)
	return "commits held by a semi-synchronous replica that never answers", exec(`SET GLOBAL rpl_semi_sync_master_enabled = OFF`)
}
