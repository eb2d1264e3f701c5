package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	idemmsg "github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/webhook"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/testsvc"
	"github.com/idem-go/idem/outbox"
)

// timedHook is a webhook endpoint that keeps when it first received each
// event.
type timedHook struct {
	srv   *httptest.Server
	mu    sync.Mutex
	first map[uuid.UUID]time.Time
}

func newTimedHook(t *testing.T) *timedHook {
	t.Helper()
	h := &timedHook{first: map[uuid.UUID]time.Time{}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req webhook.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		now := time.Now()
		h.mu.Lock()
		for _, m := range req.Messages {
			if _, ok := h.first[m.EventID]; !ok {
				h.first[m.EventID] = now
			}
		}
		h.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *timedHook) at(id uuid.UUID) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.first[id]
	return at, ok
}

// TestCDCKilledHoldingDelayedRows: "idem cdc" on PostgreSQL SIGKILLed while
// delayed rows wait in the table for their time; the next process publishes
// each of them once due, never before, and deletes them.
func TestCDCKilledHoldingDelayedRows(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	dropSlotAtCleanup(t, pg)
	w := outbox.NewWriter(pg.Driver)
	killedHoldingDelayed(t,
		func(name, url string) *cdcProc { return startCDC(t, name, pg, url, "") },
		func(evs ...idemmsg.Event) error { return w.AddExec(context.Background(), pg.Driver.Pool(), evs...) },
		func() int { return pg.Count(t, "outbox") })
}

// TestBinlogKilledHoldingDelayedRows is the same on MariaDB's binlog relay.
func TestBinlogKilledHoldingDelayedRows(t *testing.T) {
	t.Parallel()
	db := testdb.NewMariaDB(t)
	w := outbox.NewWriter(db.Driver)
	killedHoldingDelayed(t,
		func(name, url string) *cdcProc { return startBinlog(t, name, db, url, "") },
		func(evs ...idemmsg.Event) error { return w.AddExec(context.Background(), db.Driver.Pool(), evs...) },
		func() int { return db.Count(t, "outbox") })
}

func killedHoldingDelayed(t *testing.T, start func(name, url string) *cdcProc, add func(...idemmsg.Event) error, rows func() int) {
	h := newTimedHook(t)
	p := start("first", h.srv.URL+"/events")
	p.waitStreaming(t)

	due := time.Now().Add(4 * time.Second)
	var delayed []idemmsg.Event
	for i := range 20 {
		ev, err := idemmsg.NewEvent("order.order.reminded.v1", "order", "a", map[string]int{"n": i})
		if err != nil {
			t.Fatal(err)
		}
		ev.NotBefore = due
		delayed = append(delayed, ev)
	}
	if err := add(delayed...); err != nil {
		t.Fatal(err)
	}
	// A sentinel of the same aggregate, committed after them: once it is
	// published, the relay has read past them.
	sentinel, err := idemmsg.NewEvent("order.order.changed.v1", "order", "a", map[string]int{"n": 99})
	if err != nil {
		t.Fatal(err)
	}
	if err := add(sentinel); err != nil {
		t.Fatal(err)
	}
	testsvc.WaitFor(t, 30*time.Second, "the sentinel published", func() bool { _, ok := h.at(sentinel.ID); return ok })
	for _, ev := range delayed {
		if _, ok := h.at(ev.ID); ok {
			t.Fatalf("delayed event %s published before its time", ev.ID)
		}
	}
	testsvc.WaitFor(t, 30*time.Second, "the sentinel's row deleted, the delayed ones kept", func() bool {
		return rows() == len(delayed)
	})
	p.kill()

	p2 := start("second", h.srv.URL+"/events")
	testsvc.WaitFor(t, 60*time.Second, "every delayed event published", func() bool {
		for _, ev := range delayed {
			if _, ok := h.at(ev.ID); !ok {
				return false
			}
		}
		return true
	})
	for _, ev := range delayed {
		if at, _ := h.at(ev.ID); at.Before(ev.NotBefore) {
			t.Errorf("delayed event %s published %v before its time", ev.ID, ev.NotBefore.Sub(at))
		}
	}
	testsvc.WaitFor(t, 30*time.Second, "the delayed rows deleted", func() bool { return rows() == 0 })
	p2.stop(t)
}
