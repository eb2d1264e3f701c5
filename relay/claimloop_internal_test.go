package relay

import (
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	const ms = time.Millisecond
	type round struct {
		woken, found, lingers bool
		want                  time.Duration
	}
	tests := []struct {
		name            string
		poll, busy, max time.Duration
		rounds          []round
	}{
		{"no rows: the interval doubles to the cap", 100 * ms, 0, 350 * ms, []round{
			{false, false, false, 200 * ms}, {false, false, false, 350 * ms}, {false, false, false, 350 * ms}}},
		{"no cap: the interval stays", 100 * ms, 0, 0, []round{
			{false, false, false, 100 * ms}, {false, false, false, 100 * ms}}},
		{"rows a poll finds bring the interval back", 100 * ms, 0, time.Second, []round{
			{false, false, false, 200 * ms}, {false, false, false, 400 * ms}, {false, true, false, 100 * ms}, {false, false, false, 200 * ms}}},
		{"rows a wake-up announced leave it", 100 * ms, 0, time.Second, []round{
			{false, false, false, 200 * ms}, {false, false, false, 400 * ms}, {true, true, false, 400 * ms}, {true, true, false, 400 * ms}, {false, false, false, 800 * ms}}},
		{"a wake-up that finds nothing doubles it", 100 * ms, 0, time.Second, []round{
			{false, false, false, 200 * ms}, {true, false, false, 400 * ms}}},
		{"no cap: a wake-up with rows keeps the poll interval", 100 * ms, 0, 0, []round{
			{true, true, false, 100 * ms}, {true, false, false, 100 * ms}}},
		{"a lingering worker polls at the busy pace", 100 * ms, 5 * ms, time.Second, []round{
			{false, true, true, 5 * ms}, {false, true, true, 5 * ms}, {false, false, false, 200 * ms}}},
		{"rows without the lingering place: the poll interval", 100 * ms, 5 * ms, time.Second, []round{
			{false, false, false, 200 * ms}, {false, true, false, 100 * ms}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newPacer(Config{PollInterval: tt.poll, BusyPollInterval: tt.busy, MaxPollInterval: tt.max})
			for i, r := range tt.rounds {
				if r.lingers && !p.mayLinger(r.found) {
					t.Fatalf("round %d: mayLinger(%v) = false", i, r.found)
				}
				if got := p.next(r.found, r.woken, r.lingers); got != r.want {
					t.Fatalf("round %d: next = %v, want %v", i, got, r.want)
				}
			}
		})
	}
	if p := newPacer(Config{PollInterval: time.Second}); p.mayLinger(true) {
		t.Fatal("mayLinger without BusyPollInterval")
	}
}
