package backoff

import (
	"testing"
	"time"
)

func TestExponential(t *testing.T) {
	tests := []struct {
		base, max time.Duration
		attempt   int
		want      time.Duration // before jitter: the result is in [want/2, want]
	}{
		{10 * time.Millisecond, time.Second, 0, 10 * time.Millisecond},
		{10 * time.Millisecond, time.Second, 1, 10 * time.Millisecond},
		{10 * time.Millisecond, time.Second, 2, 20 * time.Millisecond},
		{10 * time.Millisecond, time.Second, 4, 80 * time.Millisecond},
		{10 * time.Millisecond, time.Second, 8, time.Second},
		{10 * time.Millisecond, time.Second, 1000, time.Second},
		{time.Hour, 2 * time.Hour, 64, 2 * time.Hour}, // no overflow
		{time.Millisecond, 0, 3, 4 * time.Millisecond},
		{0, time.Second, 5, 0},
	}
	for _, tt := range tests {
		for range 100 {
			got := Exponential(tt.base, tt.max, tt.attempt)
			if got < tt.want/2 || got > tt.want {
				t.Fatalf("Exponential(%v, %v, %d) = %v, want in [%v, %v]", tt.base, tt.max, tt.attempt, got, tt.want/2, tt.want)
			}
		}
	}
}

func TestDoubled(t *testing.T) {
	tests := []struct {
		base, max time.Duration
		attempt   int
		want      time.Duration
	}{
		{100 * time.Microsecond, 5 * time.Millisecond, 0, 100 * time.Microsecond},
		{100 * time.Microsecond, 5 * time.Millisecond, 1, 100 * time.Microsecond},
		{100 * time.Microsecond, 5 * time.Millisecond, 2, 200 * time.Microsecond},
		{100 * time.Microsecond, 5 * time.Millisecond, 6, 3200 * time.Microsecond},
		{100 * time.Microsecond, 5 * time.Millisecond, 7, 5 * time.Millisecond},
		{100 * time.Microsecond, 5 * time.Millisecond, 1000, 5 * time.Millisecond},
		{time.Hour, 2 * time.Hour, 64, 2 * time.Hour}, // no overflow
		{time.Millisecond, 0, 3, 4 * time.Millisecond},
		{0, time.Second, 5, 0},
	}
	for _, tt := range tests {
		if got := Doubled(tt.base, tt.max, tt.attempt); got != tt.want {
			t.Errorf("Doubled(%v, %v, %d) = %v, want %v", tt.base, tt.max, tt.attempt, got, tt.want)
		}
	}
}

func TestJitter(t *testing.T) {
	for range 1000 {
		got := Jitter(time.Second, 0.2)
		if got < 800*time.Millisecond || got > 1200*time.Millisecond {
			t.Fatalf("Jitter(1s, 0.2) = %v", got)
		}
	}
	if got := Jitter(time.Second, 0); got != time.Second {
		t.Fatalf("Jitter(1s, 0) = %v", got)
	}
}

func TestBackoff(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: time.Second}
	for i, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		want *= time.Millisecond
		if got := b.Next(); got < want/2 || got > want {
			t.Fatalf("failure %d: Next() = %v, want in [%v, %v]", i+1, got, want/2, want)
		}
	}
	if b.Failures() != 6 {
		t.Fatalf("Failures() = %d, want 6", b.Failures())
	}
	b.Reset()
	if got := b.Next(); got > 100*time.Millisecond {
		t.Fatalf("Next() after Reset = %v, want at most 100ms", got)
	}
}
