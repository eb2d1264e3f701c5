package inbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/internal/testdb"
)

// Environment of the child processes of TestGroupProcessKilled.
const (
	groupChildURL    = "IDEM_TEST_GROUP_CHILD_URL"
	groupChildMember = "IDEM_TEST_GROUP_CHILD_MEMBER"
)

// logSub is a partition subscriber of a child process: it records its
// Start and Stop in group_log, with the database's clock.
type logSub struct {
	pool      *pgxpool.Pool
	member    string
	partition int
}

func (s logSub) log(ctx context.Context, kind string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO group_log (member, partition_no, kind) VALUES ($1, $2, $3)`, s.member, s.partition, kind)
	return err
}

func (s logSub) Start(ctx context.Context) error { return s.log(ctx, "start") }
func (s logSub) Stop(ctx context.Context) error  { return s.log(context.WithoutCancel(ctx), "stop") }

// TestGroupChildProcess is the child of TestGroupProcessKilled: a replica
// running a Group until it is killed or interrupted. It does nothing in a
// normal run.
func TestGroupChildProcess(t *testing.T) {
	url := os.Getenv(groupChildURL)
	if url == "" {
		t.Skip("the child process of TestGroupProcessKilled")
	}
	member := os.Getenv(groupChildMember)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	c, err := New(postgres.NewPgx(pool), Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGroup(c, GroupConfig{Partitions: testPartitions, MemberID: member, Heartbeat: testHeartbeat, LeaseTTL: testLeaseTTL,
		Subscriber: func(p int) (broker.Subscriber, error) { return logSub{pool, member, p}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestGroupProcessKilled: two replicas in processes of their own; one is
// SIGKILLed (no release, no leave, its subscribers gone with it); the
// other takes its partitions within LeaseTTL + Heartbeat, by the
// database's clock, and owns them all.
func TestGroupProcessKilled(t *testing.T) {
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `CREATE TABLE group_log (seq bigserial PRIMARY KEY, member text NOT NULL, partition_no int NOT NULL,
    kind text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	ctx := context.Background()
	start := func(member string) (*exec.Cmd, *bytes.Buffer) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestGroupChildProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), groupChildURL+"="+pg.URL, groupChildMember+"="+member)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("replica %s:\n%s", member, out.String())
			}
		})
		return cmd, &out
	}
	leases := pg.Driver.Dialect().(driver.GroupLeases)
	// owners waits until the live owners of the partitions are exactly
	// want (member -> partition count), and returns them.
	owners := func(want map[string]int) map[int]string {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			st, err := leases.ListGroups(ctx, pg.Driver.Pool(), "stock")
			if err != nil {
				t.Fatal(err)
			}
			got, count := map[int]string{}, map[string]int{}
			for _, p := range st.Partitions {
				if p.Live(st.Now) {
					got[p.Partition] = p.Owner
					count[p.Owner]++
				}
			}
			if fmt.Sprint(count) == fmt.Sprint(want) {
				return got
			}
			if time.Now().After(deadline) {
				t.Fatalf("live owners %v after 60s, want counts %v", got, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	start("a")
	owners(map[string]int{"a": testPartitions})
	victim, _ := start("b")
	half := testPartitions / 2
	before := owners(map[string]int{"a": half, "b": half})

	if err := victim.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = victim.Wait()
	var killed time.Time
	if err := pg.Pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&killed); err != nil {
		t.Fatal(err)
	}
	owners(map[string]int{"a": testPartitions})
	var took []time.Duration
	for p, m := range before {
		if m != "b" {
			continue
		}
		var at time.Time
		if err := pg.Pool.QueryRow(ctx, `SELECT max(at) FROM group_log WHERE member = 'a' AND kind = 'start' AND partition_no = $1`, p).Scan(&at); err != nil {
			t.Fatal(err)
		}
		took = append(took, at.Sub(killed))
	}
	t.Logf("partitions of the killed replica started by the other %v after the kill (LeaseTTL %v, Heartbeat %v)", took, testLeaseTTL, testHeartbeat)
	for _, d := range took {
		if limit := testLeaseTTL + 2*testHeartbeat; d > limit {
			t.Errorf("takeover %v after the kill, want at most %v", d, limit)
		}
	}
	var stops int
	if err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM group_log WHERE member = 'b' AND kind = 'stop'`).Scan(&stops); err != nil {
		t.Fatal(err)
	}
	if stops != 0 {
		t.Errorf("the killed replica recorded %d stops, want none (SIGKILL)", stops)
	}
}
