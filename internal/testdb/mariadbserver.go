package testdb

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testtls"
)

// MariaDBServer is a MariaDB server of one test's own, on its own port and
// data directory, for the settings a test cannot make on the shared server
// without disturbing every other test (its global variables, the defaults
// of a server nobody configured). StartMariaDB makes one; it is stopped and
// removed when the test ends.
type MariaDBServer struct {
	// URL is the server's idem_test database, as the user idem (all
	// privileges): mysql://idem:idem@127.0.0.1:PORT/idem_test, with the
	// TLS parameters of MariaDBOptions.TLS.
	URL string
	// Port is the port it listens on, on 127.0.0.1.
	Port int

	cmd    *exec.Cmd
	exited chan struct{} // closed when the server's process has ended
	dir    string
}

// StartMariaDB starts a new MariaDB server with MariaDB's defaults (no
// configuration file is read but the one it writes: a data directory, a
// port and a socket of its own, small InnoDB files) and conf appended to
// the [mysqld] section ("log_bin = mariadb-bin", "binlog_format = ROW"),
// and waits until it accepts connections. It needs mariadbd and
// mariadb-install-db (the mariadb-server package, which make test
// installs); as root, the server runs as the mysql system user.
func StartMariaDB(t testing.TB, conf ...string) *MariaDBServer {
	t.Helper()
	return StartMariaDBWith(t, MariaDBOptions{Conf: conf})
}

// SharedBinlog are the binlog settings of the shared test server
// (scripts/lib/mariadb.sh), for a server of a test's own whose binlog is
// read as the shared one's.
var SharedBinlog = []string{"server_id = 1", "log_bin = mariadb-bin", "binlog_format = ROW",
	"binlog_row_image = FULL", "binlog_row_metadata = FULL"}

// MariaDBOptions say how StartMariaDBWith configures a server.
type MariaDBOptions struct {
	// Conf is appended to the [mysqld] section.
	Conf []string
	// TLS, when set, gives the server the PKI's certificate and CA
	// (ssl_cert, ssl_key, ssl_ca), and the user idem is created with
	// REQUIRE X509: TLS and a client certificate the CA signed, or access
	// denied. URL then asks for sslmode=verify-full with the PKI's CA and
	// client certificate.
	TLS *testtls.PKI

	// unlogged keeps the statements that create the user idem and the
	// database idem_test out of the binlog: a replica has them of its own,
	// and must not give them GTIDs (StartReplica).
	unlogged bool
}

// StartMariaDBWith is StartMariaDB with options.
func StartMariaDBWith(t testing.TB, o MariaDBOptions) *MariaDBServer {
	t.Helper()
	mysqld := mariaDBCommand(t, "mariadbd", "mysqld")
	installDB := mariaDBCommand(t, "mariadb-install-db", "mysql_install_db")
	dir, err := os.MkdirTemp(os.Getenv("IDEM_TEST_DIR"), "mariadb-server-")
	if err != nil {
		t.Fatal(err)
	}
	// Removed last, after the server stopped, even when it never started.
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	runAs, uid, gid := serverUser(t, dir, "mysql")
	s := &MariaDBServer{dir: dir}
	if s.Port, err = freePort(); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "mysqld.sock")
	logFile := filepath.Join(dir, "mysqld.log")
	settings := []string{
		"[mysqld]",
		"datadir = " + filepath.Join(dir, "data"),
		"tmpdir = " + dir,
		"socket = " + sock,
		"pid-file = " + filepath.Join(dir, "mysqld.pid"),
		"log-error = " + logFile,
		fmt.Sprintf("port = %d", s.Port),
		"bind-address = 127.0.0.1",
		"skip-name-resolve",
		"skip-external-locking",
		"innodb_buffer_pool_size = 32M",
		"innodb_log_file_size = 16M",
	}
	if runAs != "" {
		settings = append(settings, "user = "+runAs)
	}
	if o.TLS != nil {
		ca, cert, key, err := o.TLS.CopyTo(dir, uid, gid)
		if err != nil {
			t.Fatal(err)
		}
		settings = append(settings, "ssl_ca = "+ca, "ssl_cert = "+cert, "ssl_key = "+key)
	}
	cnf := filepath.Join(dir, "my.cnf")
	text := "# Written by internal/testdb for one test: MariaDB's defaults but for these.\n" + strings.Join(append(settings, o.Conf...), "\n") + "\n"
	if err := os.WriteFile(cnf, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	install := exec.Command(installDB, "--defaults-file="+cnf, "--auth-root-authentication-method=normal",
		"--skip-test-db", "--skip-name-resolve")
	if runAs != "" {
		install.Args = append(install.Args, "--user="+runAs)
	}
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", installDB, err, out)
	}
	if err := writeMariaDBStart(dir, mysqld, cnf, sock, logFile); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(mysqld, "--defaults-file="+cnf)
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT) // in case a test froze it
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		// A test that killed the server started another with
		// StartCommand, which is no child of this process.
		s.kill()
	})
	root, err := mysql.Open("root@unix(" + sock + ")/")
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		err := root.PingContext(ctx)
		if err == nil {
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logFile)
			t.Fatalf("mariadbd exited during start-up\n%s", log)
		case <-ctx.Done():
			log, _ := os.ReadFile(logFile)
			t.Fatalf("test MariaDB on port %d not ready: %v\n%s", s.Port, err, log)
		case <-time.After(50 * time.Millisecond):
		}
	}
	require := ""
	if o.TLS != nil {
		require = " REQUIRE X509"
	}
	conn, err := root.Conn(ctx)
	if err != nil {
		t.Fatalf("test MariaDB: %v", err)
	}
	defer conn.Close()
	setup := []string{"CREATE DATABASE idem_test",
		"CREATE USER 'idem'@'%' IDENTIFIED BY 'idem'" + require, "GRANT ALL PRIVILEGES ON *.* TO 'idem'@'%'",
		"CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'", "GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION"}
	if o.unlogged {
		setup = append([]string{"SET SESSION sql_log_bin = 0"}, setup...)
	}
	for _, q := range setup {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("test MariaDB: %s: %v", q, err)
		}
	}
	s.URL = fmt.Sprintf("mysql://idem:idem@127.0.0.1:%d/idem_test", s.Port)
	if o.TLS != nil {
		s.URL += "?" + url.Values{"sslmode": {"verify-full"}, "sslrootcert": {o.TLS.CA},
			"sslcert": {o.TLS.ClientCert}, "sslkey": {o.TLS.ClientKey}}.Encode()
	}
	return s
}

// NewDB creates a fresh database on the server, as NewMariaDB does on the
// shared one.
func (s *MariaDBServer) NewDB(t testing.TB, opts ...Options) *SQLDB {
	t.Helper()
	return newMariaDB(t, s.URL, opts...)
}

// StartCommand returns the command that starts the server again with its
// data, unless it runs, and waits until it accepts connections: what a
// test that kills the server with SIGKILL runs to bring it back, from any
// goroutine.
func (s *MariaDBServer) StartCommand() []string {
	return []string{"sh", filepath.Join(s.dir, "start")}
}

// writeMariaDBStart writes the script StartCommand runs in dir.
func writeMariaDBStart(dir, mysqld, cnf, sock, logFile string) error {
	admin, err := findMariaDBCommand("mariadb-admin", "mysqladmin")
	if err != nil {
		return err
	}
	q := func(p string) string { return "'" + strings.ReplaceAll(p, "'", `'\''`) + "'" }
	script := fmt.Sprintf(`#!/bin/sh
# Start the test's MariaDB server again with its data; wait until it answers.
cd %[1]s || exit 1
ping() { %[3]s --no-defaults --socket=%[4]s --user=root --connect-timeout=2 ping >/dev/null 2>&1; }
ping && exit 0
setsid %[2]s --defaults-file=%[5]s </dev/null >>%[6]s 2>&1 &
i=0
until ping; do
	i=$((i + 1))
	if [ $i -ge 1200 ]; then echo "MariaDB not ready after 120s" >&2; tail -n 30 %[7]s >&2; exit 1; fi
	sleep 0.1
done
`, q(dir), q(mysqld), q(admin), q(sock), q(cnf), q(filepath.Join(dir, "mariadbd.out")), q(logFile))
	return os.WriteFile(filepath.Join(dir, "start"), []byte(script), 0o755)
}

// kill kills the server of the pid file, if it runs, and waits until it
// is gone.
func (s *MariaDBServer) kill() {
	b, err := os.ReadFile(filepath.Join(s.dir, "mysqld.pid"))
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	// The first server's pid stays in the file after a SIGKILL (Kill):
	// that process is gone and waited for, its pid maybe another's now.
	if err != nil || pid <= 0 || pid == s.cmd.Process.Pid {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGCONT) // in case a test froze it
	_ = syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
}

// mariaDBCommand returns the path of a MariaDB program, or of its older
// name, on PATH or in /usr/sbin and /usr/bin.
func mariaDBCommand(t testing.TB, names ...string) string {
	t.Helper()
	p, err := findMariaDBCommand(names...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// findMariaDBCommand is mariaDBCommand for code that is not a test.
func findMariaDBCommand(names ...string) (string, error) {
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
		for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
			if p := filepath.Join(dir, name); isExecutable(p) {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("%s not found: install mariadb-server (make test does)", names[0])
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}
