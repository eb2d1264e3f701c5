// Package procstat reads CPU times from Linux's /proc: a process's, a
// process tree's, and the whole machine's. shopctl load's cost report and the
// benchmarks that say how many cores a run kept busy read them here.
package procstat

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// ClockTicks is the unit of the CPU times in /proc (USER_HZ): 100 on every
// Linux architecture Go runs on.
const ClockTicks = 100

// ErrNoProcess is returned for a process id that does not exist (or has
// ended).
var ErrNoProcess = errors.New("no such process")

// Process is one line of /proc/<pid>/stat, the fields this package reads.
type Process struct {
	PID, PPID int
	// Comm is the command name (at most 15 bytes, as the kernel keeps it).
	Comm string
	// State is the kernel's one-letter state: R running, S sleeping,
	// T stopped by a signal, Z zombie, and so on.
	State string
	// Own is the process's user and system time; Reaped that of its
	// children it has waited for (cutime and cstime).
	Own, Reaped time.Duration
}

// Read reads /proc/<pid>/stat.
func Read(pid int) (Process, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Process{}, ErrNoProcess
		}
		return Process{}, err
	}
	return parse(pid, string(b))
}

// parse reads a /proc/<pid>/stat line. The command name, in parentheses,
// may hold spaces and parentheses: the fields start after the last ')',
// with the state (field 3).
func parse(pid int, s string) (Process, error) {
	l, r := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if l < 0 || r < l {
		return Process{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[r+1:])
	if len(f) < 15 {
		return Process{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	p := Process{PID: pid, Comm: s[l+1 : r], State: f[0]}
	p.PPID, _ = strconv.Atoi(f[1]) // field 4
	var ticks [4]int64             // fields 14-17: utime stime cutime cstime
	for i := range ticks {
		n, err := strconv.ParseInt(f[11+i], 10, 64)
		if err != nil {
			return Process{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
		}
		ticks[i] = n
	}
	p.Own = toDuration(ticks[0] + ticks[1])
	p.Reaped = toDuration(ticks[2] + ticks[3])
	return p, nil
}

func toDuration(ticks int64) time.Duration { return time.Duration(ticks) * time.Second / ClockTicks }

// All reads every process of /proc; those that end meanwhile are left out.
func All() []Process {
	entries, _ := os.ReadDir("/proc")
	out := make([]Process, 0, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, err := Read(pid); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// TreeCPU is the CPU time spent by pid and its descendants: the live ones
// from /proc, the ended ones through their parents' reaped time.
func TreeCPU(pid int) (time.Duration, error) {
	root, err := Read(pid)
	if err != nil {
		return 0, err
	}
	children := map[int][]Process{}
	for _, p := range All() {
		if p.PID != pid {
			children[p.PPID] = append(children[p.PPID], p)
		}
	}
	total := root.Own + root.Reaped
	queue := children[pid]
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		total += p.Own + p.Reaped
		queue = append(queue, children[p.PID]...)
	}
	return total, nil
}

// Machine is the machine's CPU time so far, from the first line of
// /proc/stat.
type Machine struct {
	// Busy is the time the cores spent on anything but idling and
	// waiting for I/O; Total includes both.
	Busy, Total time.Duration
}

// ReadMachine reads /proc/stat.
func ReadMachine() (Machine, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Machine{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal guest guest_nice
	if len(f) < 9 || f[0] != "cpu" {
		return Machine{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	var busy, total int64
	for i, v := range f[1:9] { // guest time is already counted in user
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Machine{}, fmt.Errorf("/proc/stat: unexpected first line %q", line)
		}
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return Machine{Busy: toDuration(busy), Total: toDuration(total)}, nil
}

// CoresBusy returns how many of the machine's cores were busy on average
// between m and a later reading.
func (m Machine) CoresBusy(later Machine) float64 {
	total := later.Total - m.Total
	if total <= 0 {
		return 0
	}
	return float64(later.Busy-m.Busy) / float64(total) * float64(runtime.NumCPU())
}

// WaitStopped waits until every thread of process pid is stopped by a signal
// (state T), as they are some time after a SIGSTOP: the kernel delivers it to
// each thread on its way back to user space, so a process read just after
// kill(2) returns may still be running. It returns an error naming the first
// thread still running when timeout passes, or ErrNoProcess.
func WaitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		running, err := runningThread(pid)
		if err != nil || running == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d: thread %d not stopped after %v", pid, running, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runningThread returns a thread of pid that is not stopped, or 0.
func runningThread(pid int) (int, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, ErrNoProcess
		}
		return 0, err
	}
	for _, e := range tasks {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(dir + "/" + e.Name() + "/stat")
		if err != nil {
			continue // the thread has ended
		}
		th, err := parse(tid, string(b))
		if err != nil {
			return 0, err
		}
		if th.State != "T" && th.State != "t" && th.State != "Z" && th.State != "X" {
			return tid, nil
		}
	}
	return 0, nil
}
