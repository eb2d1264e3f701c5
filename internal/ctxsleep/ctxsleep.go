// Package ctxsleep waits for a duration or until a context ends, for the
// loops that back off between attempts and must stop at once on Stop.
package ctxsleep

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx is done, and reports whether d passed
// with ctx still live. A d of zero or less returns at once.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
