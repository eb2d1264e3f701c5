package procstat

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	// A command name with a space and a parenthesis, as the kernel writes
	// it; utime 7, stime 3, cutime 20, cstime 10.
	line := "4242 (my (odd) cmd) S 17 4242 4242 0 -1 4194560 100 0 0 0 7 3 20 10 20 0 1 0 12345 1000 10"
	p, err := parse(4242, line)
	if err != nil {
		t.Fatal(err)
	}
	want := Process{PID: 4242, PPID: 17, Comm: "my (odd) cmd", State: "S", Own: 100 * time.Millisecond, Reaped: 300 * time.Millisecond}
	if p != want {
		t.Fatalf("parse = %+v, want %+v", p, want)
	}
	for _, bad := range []string{"", "4242 cmd S 1", "4242 (cmd) S 1 2 3", "4242 (cmd) S 17 1 1 0 -1 0 0 0 0 0 x 3 20 10"} {
		if _, err := parse(4242, bad); err == nil {
			t.Errorf("parse(%q): no error", bad)
		}
	}
}

// TestTreeCPUAndMachine: this process's CPU time grows while it works, and
// so does the machine's busy time; a process that is not there is
// ErrNoProcess.
func TestTreeCPUAndMachine(t *testing.T) {
	before, err := TreeCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	m0, err := ReadMachine()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		x := 0
		for i := range 20_000_000 {
			x += i
		}
		_ = x
		after, err := TreeCPU(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		m1, err := ReadMachine()
		if err != nil {
			t.Fatal(err)
		}
		if after > before && m1.Busy > m0.Busy {
			if c := m0.CoresBusy(m1); c <= 0 {
				t.Fatalf("CoresBusy = %v after work", c)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time did not grow in 10 s of work: process %v -> %v, machine busy %v -> %v", before, after, m0.Busy, m1.Busy)
		}
	}
	if _, err := TreeCPU(1 << 30); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("TreeCPU of a missing process: %v, want ErrNoProcess", err)
	}
	found := false
	for _, p := range All() {
		if p.PID == os.Getpid() {
			found = true
		}
	}
	if !found {
		t.Fatal("All does not list this process")
	}
}

// TestWaitStopped: a process sent SIGSTOP is reported stopped once all its
// threads are; a running one is not; a process that is not there is
// ErrNoProcess.
func TestWaitStopped(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	if err := WaitStopped(pid, 20*time.Millisecond); err == nil {
		t.Fatal("WaitStopped on a sleeping process: no error")
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if err := WaitStopped(pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if p, err := Read(pid); err != nil || p.State != "T" {
		t.Fatalf("after WaitStopped: state %q, %v; want T", p.State, err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err := WaitStopped(pid, time.Second); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("WaitStopped on an ended process = %v, want ErrNoProcess", err)
	}
}
