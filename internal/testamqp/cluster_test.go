package testamqp

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/internal/procstat"
)

// TestCluster starts a 2-node cluster (broker/amqp/clustertest runs a
// 3-node one), kills, restarts, freezes and thaws a node, and checks that
// Close leaves no process behind.
func TestCluster(t *testing.T) {
	t0 := time.Now()
	c, err := NewCluster(2)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("2-node cluster up in %v", time.Since(t0).Round(100*time.Millisecond))
	closed := false
	defer func() {
		if !closed {
			_ = c.Close()
		}
	}()
	status := c.Ctl(t, 1, "cluster_status")
	for i := range 2 {
		if !strings.Contains(status, c.NodeName(i)) {
			t.Fatalf("cluster_status of node 1 does not list node %s:\n%s", c.NodeName(i), status)
		}
	}
	dial := func(i int) error {
		conn, err := amqp091.Dial(c.NodeURL(i))
		if err == nil {
			conn.Close()
		}
		return err
	}
	pids := []int{c.Pid(t, 0), c.Pid(t, 1)}
	c.Kill(t, 1)
	if err := dial(1); err == nil {
		t.Fatal("killed node 1 still accepts connections")
	}
	if err := dial(0); err != nil {
		t.Fatalf("node 0 after node 1's death: %v", err)
	}
	t1 := time.Now()
	c.Start(t, 1)
	t.Logf("node restarted in %v", time.Since(t1).Round(100*time.Millisecond))
	if err := dial(1); err != nil {
		t.Fatalf("restarted node 1: %v", err)
	}
	pids = append(pids, c.Pid(t, 1))
	c.Freeze(t, 0)
	if st := procState(c.Pid(t, 0)); st != "T" {
		t.Errorf("frozen node state %q, want T (stopped)", st)
	}
	c.Thaw(t, 0)
	if err := dial(0); err != nil {
		t.Fatalf("thawed node 0: %v", err)
	}
	dir := c.dir
	closed = true
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil && procState(pid) != "Z" {
			t.Errorf("node process %d still runs after Close", pid)
		}
	}
	if err := syscall.Kill(c.epmd.Process.Pid, 0); err == nil {
		t.Errorf("epmd %d still runs after Close", c.epmd.Process.Pid)
	}
	if _, err := os.Stat(filepath.Join(dir, "owner")); !os.IsNotExist(err) {
		t.Errorf("cluster directory left: %v", err)
	}
}

func procState(pid int) string {
	p, err := procstat.Read(pid)
	if err != nil {
		return ""
	}
	return p.State
}
