package brokertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/fault"
)

// childEnv carries to a child process of the suite what it must run (a
// childConfig in JSON); its presence makes ChildMain run the child.
const childEnv = "IDEM_BROKERTEST_CHILD"

// childConfig is what a child process runs.
type childConfig struct {
	// PostgresURL is the consumer's database.
	PostgresURL string `json:"postgres_url"`
	// Consumer is the consumer name.
	Consumer string `json:"consumer"`
	// Spec is Instance.ChildSpec(Consumer), for the transport.
	Spec json.RawMessage `json:"spec"`
}

// NewChildSubscriber returns, in a child process, the subscriber that spec
// (the JSON encoding of what Instance.ChildSpec returned) describes, feeding
// deliver. It is not started.
type NewChildSubscriber func(spec json.RawMessage, deliver broker.DeliverFunc) (broker.Subscriber, error)

// ChildMain runs the suite's child process when this process is one, and
// returns at once otherwise. A package whose transport sets
// Features.ProcessKill calls it first in its TestMain:
//
//	func TestMain(m *testing.M) {
//		brokertest.ChildMain(newChildSubscriber)
//		goleak.VerifyTestMain(m)
//	}
//
// The suite starts the test binary again as a child, which subscribes with
// newSubscriber, feeding an EffectConsumer, until it dies at the fault point
// the test arms, or until SIGINT or SIGTERM. It then exits, with status 1
// if it could not start.
func ChildMain(newSubscriber NewChildSubscriber) {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return
	}
	if err := runChild(raw, newSubscriber); err != nil {
		fmt.Fprintln(os.Stderr, "brokertest child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runChild(raw string, newSubscriber NewChildSubscriber) error {
	var cfg childConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return fmt.Errorf("%s: %w", childEnv, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, cfg.PostgresURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	c, err := effectConsumer(postgres.NewPgx(pool), inbox.Config{Name: cfg.Consumer}, nil)
	if err != nil {
		return err
	}
	sub, err := newSubscriber(cfg.Spec, c.DeliverBatch)
	if err != nil {
		return err
	}
	if err := sub.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	return sub.Stop(context.Background())
}

// runChildUntilKilled runs a child process subscribing as consumer with the
// fault point armed, and returns once it has died there.
func runChildUntilKilled(t *testing.T, b *bundle, consumer, point string) {
	t.Helper()
	spec, err := json.Marshal(b.inst.ChildSpec(consumer))
	if err != nil {
		t.Fatalf("encode the child's spec: %v", err)
	}
	cfg, err := json.Marshal(childConfig{PostgresURL: b.pg.URL, Consumer: consumer, Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*b.tr.Features.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(cfg), fault.EnvVar+"="+point)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if !strings.Contains(stderr.String(), "fault point "+point) {
		t.Fatalf("child consumer: %v; want it killed at the fault point %s (does the package's TestMain call brokertest.ChildMain?); stderr:\n%s",
			err, point, stderr.String())
	}
}

// testKillBetweenCommitAndAck kills a real consumer process at
// Features.ProcessKill, after its transaction committed and before the
// broker learnt it: its effects are there once, the broker delivers the
// messages again, and the next consumer skips the applied ones as
// duplicates and applies the rest (G3).
func testKillBetweenCommitAndAck(t *testing.T, tr Transport) {
	fault.RequireEnabled(t)
	name := "test.order.placed.v1"
	b := setup(t, tr, Options{EventNames: []string{name}, Consumers: []string{"stock"}})
	// One key, so that the messages go one path in every transport (a
	// partition, a worker) and none is acknowledged after the kill.
	var msgs []idem.Message
	for i := range 5 {
		msgs = append(msgs, NewMessage(t, name, "42", i))
	}
	Publish(t, b.inst.Publisher, msgs...)
	runChildUntilKilled(t, b, "stock", tr.Features.ProcessKill)

	applied := b.pg.Count(t, "effect")
	if applied == 0 || applied > len(msgs) || b.pg.Count(t, "(SELECT DISTINCT event_id FROM effect) e") != applied {
		t.Fatalf("effects after the kill: %d, want between 1 and %d, each once (committed before the crash)", applied, len(msgs))
	}
	t.Logf("%d of %d messages applied before the kill", applied, len(msgs))
	b.waitFor(t, "every message waiting in the broker again", func() bool { return b.inst.Backlog(t, "stock") == len(msgs) })

	c := b.consumer(t, "stock", fastRetry, nil)
	tp, _ := b.subscribe(t, "stock", c)
	b.waitFor(t, fmt.Sprintf("%d redeliveries skipped as duplicates and %d applied", applied, len(msgs)-applied), func() bool {
		s := c.Stats()
		return s.Duplicates == uint64(applied) && s.Applied == uint64(len(msgs)-applied)
	})
	b.drained(t, "stock")
	CheckOnceInOrder(t, b.pg, "stock", msgs)
	if n := b.pg.Count(t, "processed_event WHERE consumer_name = 'stock'"); n != len(msgs) {
		t.Errorf("processed_event rows: %d, want %d", n, len(msgs))
	}
	if tr.Features.DeliveryCount {
		for _, m := range msgs[:applied] {
			if got := tp.attempts(m.EventID); len(got) == 0 || got[0] != 2 {
				t.Errorf("attempts of the redelivered %s: %v, want 2 first (the broker's delivery count)", m.EventID, got)
			}
		}
	}
	if s := c.Stats(); s.Duplicates != uint64(applied) {
		t.Errorf("duplicates %d, want %d (the messages applied before the kill)", s.Duplicates, applied)
	}
}
