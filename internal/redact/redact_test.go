package redact_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/idem-go/idem/internal/redact"
)

// TestString: every shape of secret the commands meet is masked, wherever
// it sits in a text, and texts without one come back unchanged.
func TestString(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://app:S3cret@db:5432/shop?sslmode=disable":                          "postgres://app:xxxxx@db:5432/shop?sslmode=disable",
		"postgres://app:p@ss@db/shop":                                                 "postgres://app:xxxxx@db/shop",
		"postgresql://app:S3cret@h1:5432,h2:5432/shop":                                "postgresql://app:xxxxx@h1:5432,h2:5432/shop",
		"mysql://relay:S3cret@db:3306/shop?tls=true":                                  "mysql://relay:xxxxx@db:3306/shop?tls=true",
		"amqp://guest:guest@localhost:5672/":                                          "amqp://guest:xxxxx@localhost:5672/",
		"amqp://app@localhost:5672/":                                                  "amqp://app@localhost:5672/",
		"amqps://u:S3cret@mq1:5671,mq2:5671/?cacertfile=ca.pem":                       "amqps://u:xxxxx@mq1:5671,mq2:5671/?cacertfile=ca.pem",
		"kafka://u:S3cret@a:9092,b:9092?sasl=plain":                                   "kafka://u:xxxxx@a:9092,b:9092?sasl=plain",
		"kafka://a:9092?sasl=scram-sha-256&sasl_user=u&sasl_password=S3cret&tls=true": "kafka://a:9092?sasl=scram-sha-256&sasl_user=u&sasl_password=xxxxx&tls=true",
		"nats://S3cretToken@nats:4222":                                                "nats://xxxxx@nats:4222",
		"nats://u:S3cret@nats:4222":                                                   "nats://u:xxxxx@nats:4222",
		"nats://embedded?dir=/tmp/x":                                                  "nats://embedded?dir=/tmp/x",
		"postgres://db/shop?user=app&password=S3cret&sslmode=require":                 "postgres://db/shop?user=app&password=xxxxx&sslmode=require",
		"postgres://db/shop?sslpassword=S3cret":                                       "postgres://db/shop?sslpassword=xxxxx",
		"host=db user=app password=S3cret dbname=shop":                                "host=db user=app password=xxxxx dbname=shop",
		"host=db password = 'it''s S3cret' dbname=shop":                               "host=db password = xxxxx dbname=shop",
		`host=db password='a\'b S3cret' dbname=shop`:                                  "host=db password=xxxxx dbname=shop",
		"PASSWORD=S3cret":                                                             "PASSWORD=xxxxx",
		"https://hooks.example.com/idem?secret=whsec_S3cret&mode=message":             "https://hooks.example.com/idem?secret=xxxxx&mode=message",
		"https://hooks.example.com/cb?client_secret=S3cret":                           "https://hooks.example.com/cb?client_secret=xxxxx",
		"https://hooks.example.com/idem?SECRET=S3cret":                                "https://hooks.example.com/idem?SECRET=xxxxx",
		"https://hooks.example.com/idem?secret_file=/run/secrets/wh&secret_env=WH":    "https://hooks.example.com/idem?secret_file=/run/secrets/wh&secret_env=WH",
		"idem:S3cret@tcp(127.0.0.1:13306)/idem_test?parseTime=true":                   "idem:xxxxx@tcp(127.0.0.1:13306)/idem_test?parseTime=true",
		"idem:p@S3cret@unix(/run/mysqld.sock)/shop":                                   "idem:xxxxx@unix(/run/mysqld.sock)/shop",
		`dial "postgres://app:S3cret@db/shop": refused; then amqp://g:S3cret@mq/ too`: `dial "postgres://app:xxxxx@db/shop": refused; then amqp://g:xxxxx@mq/ too`,
		"no secret here: 10:30 at host db, user@example.com":                          "no secret here: 10:30 at host db, user@example.com",
		"password authentication failed for user \"app\" (using password: YES)":       "password authentication failed for user \"app\" (using password: YES)",
		"sqlite:/tmp/shop.db":                                                         "sqlite:/tmp/shop.db",
		"":                                                                            "",
	} {
		if got := redact.String(in); got != want {
			t.Errorf("String(%q)\n = %q\nwant %q", in, got, want)
		}
		if got := redact.String(want); got != want {
			t.Errorf("String is not idempotent on %q: %q", want, got)
		}
	}
}

// url.Parse quotes the whole URL in its errors: redacted, the password is
// gone.
func TestStringURLParseError(t *testing.T) {
	t.Parallel()
	bad := strings.Join([]string{"postgres://app:S3cret@db", "port/shop"}, ":") // an invalid port
	_, err := url.Parse(bad)
	if err == nil || !strings.Contains(err.Error(), "S3cret") {
		t.Fatalf("url.Parse error %v: want one that quotes the URL (the case this guards)", err)
	}
	if got := redact.String(err.Error()); strings.Contains(got, "S3cret") || !strings.Contains(got, "app:xxxxx@db") {
		t.Errorf("redacted: %q", got)
	}
}

// Error redacts the text and keeps the chain.
func TestError(t *testing.T) {
	t.Parallel()
	err := redact.Error(fmt.Errorf("open postgres://app:S3cret@db/shop: %w", fs.ErrNotExist))
	if got := err.Error(); got != "open postgres://app:xxxxx@db/shop: file does not exist" {
		t.Errorf("Error() = %q", got)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		t.Error("errors.Is lost the wrapped error")
	}
	if redact.Error(err) != err || redact.Error(nil) != nil {
		t.Error("Error wraps twice, or wraps nil")
	}
}

type stringer struct{}

func (stringer) String() string { return "amqp://u:S3cret@mq/" }

// Handler redacts the message and every kind of attribute, in groups and
// in attributes added with With, for both handlers the commands use.
func TestHandler(t *testing.T) {
	t.Parallel()
	for name, newHandler := range map[string]func(*bytes.Buffer) slog.Handler{
		"text": func(b *bytes.Buffer) slog.Handler { return slog.NewTextHandler(b, nil) },
		"json": func(b *bytes.Buffer) slog.Handler { return slog.NewJSONHandler(b, nil) },
	} {
		var buf bytes.Buffer
		log := slog.New(redact.Handler(newHandler(&buf))).With("db", "postgres://app:S3cret@db/shop")
		log.WithGroup("g").Info("connect to mysql://u:S3cret@db/x failed",
			"error", errors.New("dial amqp://u:S3cret@mq/: refused"),
			"stringer", stringer{},
			"list", []string{"password=S3cret"},
			slog.Group("inner", "dsn", "u:S3cret@tcp(db:3306)/x"),
			"n", 42, "plain", []string{"kept"})
		out := buf.String()
		if strings.Contains(out, "S3cret") {
			t.Errorf("%s: a secret in the log:\n%s", name, out)
		}
		for _, want := range []string{"xxxxx", "42", "kept"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %q in the log:\n%s", name, want, out)
			}
		}
	}
}

// panicEnv makes the test binary panic under ExitOnPanic, for
// TestExitOnPanic.
const panicEnv = "IDEM_TEST_REDACT_PANIC"

// TestExitOnPanic runs the test binary again to panic with a URL in the
// value: the process prints the panic redacted, its stack, and exits 2.
func TestExitOnPanic(t *testing.T) {
	if os.Getenv(panicEnv) == "1" {
		defer redact.ExitOnPanic("cmd")
		panic(fmt.Errorf("open postgres://app:S3cret@db/shop: refused"))
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestExitOnPanic$")
	cmd.Env = append(os.Environ(), panicEnv+"=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("exit: %v, want status 2\n%s", err, out)
	}
	if strings.Contains(string(out), "S3cret") || !strings.Contains(string(out), "cmd: panic: open postgres://app:xxxxx@db/shop: refused") ||
		!strings.Contains(string(out), "redact_test.TestExitOnPanic") {
		t.Errorf("output:\n%s", out)
	}
}
