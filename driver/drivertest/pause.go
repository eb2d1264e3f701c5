package drivertest

import (
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testsvc"
)

// Pauses checks driver.Pauses, the operators' pauses of consumers and
// relays: a pause reads back as it was set, to the microsecond, with the
// database's time when it gave none; setting it again replaces it; the
// listing filters by kind and name and sorts; a consumer and a relay of the
// same name are two pauses; deleting reports whether there was one.
func Pauses[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	d := db.Driver.Dialect()
	ctx := testsvc.Ctx(t, time.Minute)
	ex := db.Driver.Pool()

	from := time.Date(2026, 12, 2, 3, 0, 0, 123456000, time.UTC)
	until := from.Add(2 * time.Hour)
	at := from.Add(-time.Hour)
	shipping := idem.Pause{Kind: idem.PauseConsumer, Name: "shipping", From: from, Until: until,
		Reason: "carrier maintenance ✓", By: "alice", At: at}
	before := time.Now().Add(-time.Hour) // the database's clock may be behind ours
	fatalIf(t, d.SetPause(ctx, ex, shipping), "set the shipping pause")
	fatalIf(t, d.SetPause(ctx, ex, idem.Pause{Kind: idem.PauseConsumer, Name: "billing"}), "set the billing pause")
	fatalIf(t, d.SetPause(ctx, ex, idem.Pause{Kind: idem.PauseRelay, Name: "shipping", Reason: "relay"}), "set the relay pause")

	got, err := d.ListPauses(ctx, ex, idem.PauseConsumer, "shipping")
	fatalIf(t, err, "list the shipping pause")
	if len(got) != 1 {
		t.Fatalf("ListPauses(consumer, shipping) = %+v, want one pause", got)
	}
	p := got[0]
	if p.Kind != shipping.Kind || p.Name != shipping.Name || !p.From.Equal(from) || !p.Until.Equal(until) ||
		p.Reason != shipping.Reason || p.By != shipping.By || !p.At.Equal(at) {
		t.Errorf("pause read back as %+v, want %+v", p, shipping)
	}

	all, err := d.ListPauses(ctx, ex, "", "")
	fatalIf(t, err, "list every pause")
	var names []string
	for _, p := range all {
		names = append(names, string(p.Kind)+"/"+p.Name)
	}
	if want := "[consumer/billing consumer/shipping relay/shipping]"; fmt.Sprint(names) != want {
		t.Errorf("ListPauses(all) = %v, want %s", names, want)
	}
	for _, p := range all {
		if p.Kind == idem.PauseConsumer && p.Name == "billing" {
			if !p.From.IsZero() || !p.Until.IsZero() || p.Reason != "" || p.By != "" {
				t.Errorf("pause with only a name read back as %+v, want zero times and texts", p)
			}
			if p.At.Before(before) || p.At.After(time.Now().Add(time.Hour)) {
				t.Errorf("pause set without a time was recorded at %v, want the database's current time", p.At)
			}
		}
	}
	relays, err := d.ListPauses(ctx, ex, idem.PauseRelay, "")
	fatalIf(t, err, "list the relays' pauses")
	if len(relays) != 1 || relays[0].Name != "shipping" || relays[0].Reason != "relay" {
		t.Errorf("ListPauses(relay) = %+v, want the relay's pause alone", relays)
	}

	// Set again: replaced, a pause until resumed now.
	again := idem.Pause{Kind: idem.PauseConsumer, Name: "shipping", Reason: "again", By: "bob", At: until}
	fatalIf(t, d.SetPause(ctx, ex, again), "set the shipping pause again")
	got, err = d.ListPauses(ctx, ex, idem.PauseConsumer, "shipping")
	fatalIf(t, err, "list the replaced pause")
	if len(got) != 1 || !got[0].From.IsZero() || !got[0].Until.IsZero() || got[0].Reason != "again" ||
		got[0].By != "bob" || !got[0].At.Equal(until) {
		t.Errorf("replaced pause read back as %+v, want %+v", got, again)
	}

	ok, err := d.DeletePause(ctx, ex, idem.PauseConsumer, "shipping")
	fatalIf(t, err, "delete the shipping pause")
	if !ok {
		t.Error("DeletePause(consumer, shipping) = false, want true: it existed")
	}
	ok, err = d.DeletePause(ctx, ex, idem.PauseConsumer, "shipping")
	fatalIf(t, err, "delete the shipping pause again")
	if ok {
		t.Error("DeletePause of a deleted pause = true, want false")
	}
	left, err := d.ListPauses(ctx, ex, "", "shipping")
	fatalIf(t, err, "list what is left of shipping")
	if len(left) != 1 || left[0].Kind != idem.PauseRelay {
		t.Errorf("after deleting the consumer's pause, pauses named shipping = %+v, want the relay's alone", left)
	}
}
