//go:build idemfault

package fault

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// Enabled says whether fault points are compiled in (build tag idemfault).
const Enabled = true

var (
	once   sync.Once
	armed  atomic.Bool
	mu     sync.Mutex
	points map[string]*point
)

type point struct {
	fireAt int64
	hits   atomic.Int64
}

func load() {
	spec := os.Getenv(EnvVar)
	if spec == "" {
		return
	}
	points = map[string]*point{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, n, hasN := strings.Cut(item, "@")
		p := &point{fireAt: 1}
		if hasN {
			if v, err := strconv.ParseInt(n, 10, 64); err == nil && v > 0 {
				p.fireAt = v
			}
		}
		points[name] = p
	}
	armed.Store(len(points) > 0)
}

// Point marks the named fault point. If IDEM_FAULT arms it and this is the
// hit it fires on, the process writes "idem: fault point NAME" to stderr and
// kills itself with SIGKILL.
func Point(name string) {
	once.Do(load)
	if !armed.Load() {
		return
	}
	mu.Lock()
	p := points[name]
	mu.Unlock()
	if p == nil {
		return
	}
	if p.hits.Add(1) != p.fireAt {
		return
	}
	fmt.Fprintf(os.Stderr, "idem: fault point %s: killing process %d\n", name, os.Getpid())
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // SIGKILL is not instantaneous; never return.
}
