package testdb

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresBinDirEnv names the variable holding the bin directory of the test
// PostgreSQL server (initdb, pg_ctl), exported by make test.
const PostgresBinDirEnv = "IDEM_TEST_POSTGRES_BINDIR"

// Server is a PostgreSQL cluster of one test's own, on its own port and
// data directory, for the settings a test cannot make on the shared server
// without disturbing every other test (synchronous replication, a standby).
// StartServer makes one; it is stopped and removed when the test ends.
type Server struct {
	// URL is the server's postgres database, as the superuser postgres.
	URL string
	// Port is the port it listens on, on 127.0.0.1.
	Port int
	// Name is a standby's application name (StartStandby); "" for a
	// primary.
	Name string

	bin, dir, data string
	runAs          string
}

// StartServer starts a new PostgreSQL cluster with the settings of the
// test server (make test), conf appended to its postgresql.conf, and waits
// until it accepts connections. It needs the server's binaries
// (IDEM_TEST_POSTGRES_BINDIR); as root, the cluster runs as the postgres
// system user, since PostgreSQL refuses to run as root.
func StartServer(t testing.TB, conf ...string) *Server {
	t.Helper()
	bin := os.Getenv(PostgresBinDirEnv)
	if bin == "" {
		t.Fatalf("%s is not set: run the tests with `make test`, which installs PostgreSQL and exports where its binaries are", PostgresBinDirEnv)
	}
	s := newServer(t, bin, "pg-server-")
	if out, err := s.command("initdb", "-D", s.data, "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-locale", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	var err error
	if s.Port, err = freePort(); err != nil {
		t.Fatal(err)
	}
	settings := []string{
		"listen_addresses = '127.0.0.1'",
		fmt.Sprintf("port = %d", s.Port),
		fmt.Sprintf("unix_socket_directories = '%s'", s.dir),
		"max_connections = 50",
		"shared_buffers = 32MB",
		"wal_level = logical",
		"max_replication_slots = 8",
		"max_wal_senders = 8",
	}
	settings = append(settings, conf...)
	appendConf(t, filepath.Join(s.data, "postgresql.conf"), "the test's own server (internal/testdb)", settings)
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
	s.Start(t)
	return s
}

// newServer makes the directory of a server of the test's own, removed
// (the server stopped first) when the test ends; as root, it belongs to the
// postgres system user, who runs the server.
func newServer(t testing.TB, bin, prefix string) *Server {
	t.Helper()
	dir, err := os.MkdirTemp(os.Getenv("IDEM_TEST_DIR"), prefix)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{bin: bin, dir: dir, data: filepath.Join(dir, "data")}
	t.Cleanup(func() {
		_ = s.stop("immediate")
		_ = os.RemoveAll(dir)
	})
	s.runAs, _, _ = serverUser(t, dir, "postgres")
	return s
}

// serverUser returns "", -1, -1 when the test does not run as root; as
// root, it gives the directory dir to the system user name, who runs the
// server (PostgreSQL and MariaDB refuse to run as root), and returns name
// and its user and group ids, which own the files the server must read
// alone (its TLS key).
func serverUser(t testing.TB, dir, name string) (runAs string, uid, gid int) {
	t.Helper()
	if os.Geteuid() != 0 {
		return "", -1, -1
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatalf("as root, the test server runs as the %s system user: %v", name, err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	return name, uid, gid
}

// appendConf appends settings to a configuration file, after a comment.
func appendConf(t testing.TB, path, comment string, settings []string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("\n# --- " + comment + " ---\n" + strings.Join(settings, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Start starts the server (again) and waits until it accepts connections.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	logFile := filepath.Join(s.dir, "postgres.log")
	if out, err := s.command("pg_ctl", "-D", s.data, "-l", logFile, "-w", "-t", "60", "-s", "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		pool, err := pgxpool.New(ctx, s.URL)
		if err == nil {
			err = pool.Ping(ctx)
			pool.Close()
		}
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("test server on port %d not ready: %v", s.Port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the server (fast mode: clients are disconnected), keeping its
// data.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.stop("fast"); err != nil {
		t.Fatal(err)
	}
}

func (s *Server) stop(mode string) error {
	if err := s.command("pg_ctl", "-D", s.data, "status").Run(); err != nil {
		return nil // not running
	}
	if out, err := s.command("pg_ctl", "-D", s.data, "-m", mode, "-w", "-t", "60", "-s", "stop").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return nil
}

// command returns a command of the server's bin directory, run as the
// server's user.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	path := filepath.Join(s.bin, name)
	var cmd *exec.Cmd
	if s.runAs != "" {
		cmd = exec.Command("runuser", append([]string{"-u", s.runAs, "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = s.dir
	return cmd
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
