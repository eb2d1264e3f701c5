package ctxsleep

import (
	"context"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	if !Sleep(ctx, time.Millisecond) || !Sleep(ctx, 0) {
		t.Error("Sleep with a live context reported it done")
	}
	cancel()
	if Sleep(ctx, time.Hour) || Sleep(ctx, 0) {
		t.Error("Sleep with a done context reported the duration passed")
	}
}
