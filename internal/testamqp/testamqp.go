// Package testamqp gives tests the RabbitMQ node the test command starts
// (IDEM_TEST_SERVERS="postgres rabbitmq" make test), unique names to isolate
// them, and broker restarts that never hit another test's connections: tests
// hold a shared lock on the node (across test processes) and a restart takes
// it exclusively.
package testamqp

import (
	"crypto/rand"
	"encoding/hex"
	neturl "net/url"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/testlock"
)

// URLEnv names the variable holding the test node's URL.
const URLEnv = "IDEM_TEST_AMQP_URL"

var lock = testlock.New("rabbitmq")

func url(t testing.TB) string {
	t.Helper()
	u := os.Getenv(URLEnv)
	if u == "" {
		t.Fatalf("%s is not set: run the tests with `IDEM_TEST_SERVERS=\"postgres rabbitmq\" make test`, which starts a private RabbitMQ node", URLEnv)
	}
	return u
}

// URL returns the test node's URL, or fails the test when it is not set. The
// node is not restarted by another test until this test ends.
func URL(t testing.TB) string {
	t.Helper()
	u := url(t)
	lock.Shared(t)
	return u
}

// Exclusive returns the test node's URL and holds the node alone until the
// test ends, so that it may call Restart. Call it before URL in a test that
// does not run in parallel.
func Exclusive(t testing.TB) string {
	t.Helper()
	u := url(t)
	lock.Exclusive(t)
	return u
}

// Stop stops the node, keeping its data; the test must hold it (Exclusive).
func Stop(t testing.TB) { t.Helper(); script(t, "IDEM_TEST_RABBITMQ_STOP") }

// Start starts the node again and waits until it is ready.
func Start(t testing.TB) { t.Helper(); script(t, "IDEM_TEST_RABBITMQ_START") }

// Restart stops and starts the node.
func Restart(t testing.TB) {
	t.Helper()
	Stop(t)
	Start(t)
}

func script(t testing.TB, env string) {
	t.Helper()
	if !lock.HeldExclusively() {
		t.Fatalf("testamqp: call Exclusive before stopping or starting the node")
	}
	path := os.Getenv(env)
	if path == "" {
		t.Fatalf("%s is not set: run the tests with `IDEM_TEST_SERVERS=\"postgres rabbitmq\" make test`", env)
	}
	out, err := exec.Command(path).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", path, err, out)
	}
}

// Name returns prefix followed by a random suffix: a fresh exchange or queue
// name per test.
func Name(prefix string) string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// CtlEnv names the variable holding the rabbitmqctl wrapper of the test
// node.
const CtlEnv = "IDEM_TEST_RABBITMQCTL"

// UserURL adds a user with a random password to the test node, allowed
// everything on the node's virtual host, and returns the node's URL with
// that user and the password; the user is deleted when the test ends. For
// tests that check that a password never leaves a process: the node's own
// guest:guest is no secret.
func UserURL(t testing.TB) (rawURL, password string) {
	t.Helper()
	base := URL(t)
	ctl := os.Getenv(CtlEnv)
	if ctl == "" {
		t.Fatalf("%s is not set: run the tests with `IDEM_TEST_SERVERS=\"postgres rabbitmq\" make test`", CtlEnv)
	}
	u, err := neturl.Parse(base)
	if err != nil {
		t.Fatalf("%s: %v", URLEnv, err)
	}
	user, password := Name("idem_user_"), Name("pw")
	vhost := strings.TrimPrefix(u.Path, "/")
	if vhost == "" {
		vhost = "/"
	}
	for _, args := range [][]string{
		{"add_user", user, password},
		{"set_permissions", "-p", vhost, user, ".*", ".*", ".*"},
	} {
		if out, err := exec.Command(ctl, args...).CombinedOutput(); err != nil {
			t.Fatalf("rabbitmqctl %s: %v\n%s", args[0], err, strings.ReplaceAll(string(out), password, "xxxxx"))
		}
	}
	t.Cleanup(func() {
		if out, err := exec.Command(ctl, "delete_user", user).CombinedOutput(); err != nil {
			t.Errorf("rabbitmqctl delete_user %s: %v\n%s", user, err, out)
		}
	})
	u.User = neturl.UserPassword(user, password)
	return u.String(), password
}
