package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/memory"
	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/relay"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idem-relay-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildErr  error
)

// idemBinary builds cmd/idem once per test run, with fault points (the
// process tests kill it at them), and returns its path.
func idemBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(binDir, "idem")
	buildOnce.Do(func() {
		// go test puts its own go first in PATH.
		out, err := exec.Command("go", "build", "-tags", fault.Tag, "-o", bin, "github.com/idem-go/idem/cmd/idem").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build cmd/idem: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

// bundle is what most tests need: a fresh schema and an in-process broker.
type bundle struct {
	pg  *testdb.PG
	pub *memory.Publisher
	w   *outbox.Writer[pgx.Tx]
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pg := testdb.NewPostgres(t, testdb.Options{MaxConns: 20})
	return &bundle{pg: pg, pub: memory.New(), w: outbox.NewWriter(pg.Driver)}
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// fastConfig returns a configuration with short delays for tests.
func fastConfig(t *testing.T) relay.Config {
	return relay.Config{
		Workers:         2,
		Lease:           5 * time.Second,
		PublishTimeout:  2 * time.Second,
		PollInterval:    50 * time.Millisecond,
		RetryBackoff:    10 * time.Millisecond,
		MaxRetryBackoff: 50 * time.Millisecond,
		StatsInterval:   -1,
		Logger:          testLogger(t),
	}
}

// start starts a relay on b's database and publisher and stops it when the
// test ends.
func (b *bundle) start(t *testing.T, cfg relay.Config) *relay.Relay[pgx.Tx] {
	t.Helper()
	return startRelay(t, b.pg, b.pub, cfg)
}

func startRelay(t *testing.T, pg *testdb.PG, pub *memory.Publisher, cfg relay.Config) *relay.Relay[pgx.Tx] {
	t.Helper()
	r, err := relay.New(pg.Driver, pub, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return r
}

// event returns the version-th event of aggregate order/id.
func event(t testing.TB, id string, version int) idem.Event {
	t.Helper()
	ev, err := idem.NewEvent("order.order.changed.v1", "order", id, map[string]any{"version": version})
	if err != nil {
		t.Fatal(err)
	}
	ev.AggregateVersion = int64(version)
	return ev
}

// insert commits events, each in its own statement outside a transaction.
func (b *bundle) insert(t testing.TB, events ...idem.Event) {
	t.Helper()
	if err := b.w.AddExec(context.Background(), b.pg.Driver.Pool(), events...); err != nil {
		t.Fatal(err)
	}
}

// decode decodes a published message's envelope.
func decode(t testing.TB, m idem.Message) idem.Event {
	t.Helper()
	ev, err := idem.Decode(m)
	if err != nil {
		t.Fatalf("decode %s: %v", m.Body, err)
	}
	return ev
}

// idsOf returns the event ids of msgs, in order.
func idsOf(msgs []idem.Message) []uuid.UUID {
	out := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		out[i] = m.EventID
	}
	return out
}

// countIDs counts occurrences of each id.
func countIDs(ids []uuid.UUID) map[uuid.UUID]int {
	out := map[uuid.UUID]int{}
	for _, id := range ids {
		out[id]++
	}
	return out
}
