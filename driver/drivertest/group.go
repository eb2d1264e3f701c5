package drivertest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/internal/testsvc"
)

// GroupLeases checks driver.GroupLeases, the leases of consumers'
// ownership groups (inbox.Group), when the dialect has it (every dialect
// of idem does): members join, renew and expire; a partition is taken when
// free, expired or already the taker's, never from a live owner, even by
// concurrent takers; its epoch counts tenures; renewals report the
// partitions lost; releases free only the owner's; the listing shows every
// lease with the database's clock. Expired leases are made with a negative
// ttl (the database's time minus a second), so that nothing waits for a
// clock.
func GroupLeases[TTx any](t *testing.T, setup Setup[TTx]) {
	db := setup.open(t, Options{})
	d := db.Driver.Dialect()
	ctx := testsvc.Ctx(t, time.Minute)
	ex := db.Driver.Pool()
	const (
		c    = "stock"
		live = time.Hour
		gone = -time.Second
	)

	// Members: a, b live; x expired; a member of another consumer.
	fatalIf(t, d.HeartbeatMember(ctx, ex, c, "b", live), "heartbeat b")
	fatalIf(t, d.HeartbeatMember(ctx, ex, c, "a", time.Second), "heartbeat a")
	fatalIf(t, d.HeartbeatMember(ctx, ex, c, "a", live), "heartbeat a again")
	fatalIf(t, d.HeartbeatMember(ctx, ex, c, "x", gone), "heartbeat x (expired)")
	fatalIf(t, d.HeartbeatMember(ctx, ex, "billing", "z", live), "heartbeat z (billing)")
	st, err := d.ListGroups(ctx, ex, c)
	fatalIf(t, err, "list before expiry")
	if got := memberIDs(st); !slices.Equal(got, []string{"a", "b", "x"}) {
		t.Errorf("members listed before LiveMembers: %v, want [a b x] (expired ones stay until LiveMembers)", got)
	}
	members, err := d.LiveMembers(ctx, ex, c)
	fatalIf(t, err, "live members")
	if !slices.Equal(members, []string{"a", "b"}) {
		t.Errorf("LiveMembers = %v, want [a b]", members)
	}
	st, err = d.ListGroups(ctx, ex, c)
	fatalIf(t, err, "list after expiry")
	if got := memberIDs(st); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("members after LiveMembers: %v, want [a b] (x deleted)", got)
	}
	if st.Now.IsZero() {
		t.Error("ListGroups: Now is zero")
	}
	for _, m := range st.Members {
		// The lease is the database's time plus ttl.
		if left := m.Until.Sub(st.Now); left < live-time.Minute || left > live {
			t.Errorf("member %s: lease ends %v after the database's now, want about %v", m.ID, left, live)
		}
	}

	// A free partition is taken; a live one is not, unless it is the
	// taker's (renewed, same epoch).
	l, ok, err := d.AcquirePartition(ctx, ex, c, "a", 0, live)
	fatalIf(t, err, "a acquires 0")
	if !ok || l.Partition != 0 || l.Epoch != 1 {
		t.Errorf("a acquires free 0: %+v, %v; want epoch 1, true", l, ok)
	}
	if left := l.Until.Sub(st.Now); left < live-time.Minute || left > live+time.Minute {
		t.Errorf("lease of 0 ends %v after the database's now, want about %v", left, live)
	}
	if l, ok, err := d.AcquirePartition(ctx, ex, c, "b", 0, live); err != nil || ok {
		t.Errorf("b acquires a's live 0: %+v, %v, %v; want false", l, ok, err)
	}
	if l, ok, err := d.AcquirePartition(ctx, ex, c, "a", 0, live); err != nil || !ok || l.Epoch != 1 {
		t.Errorf("a acquires its own 0 again: %+v, %v, %v; want epoch 1 (same tenure), true", l, ok, err)
	}

	// An expired lease is taken over, with a new epoch; its former owner
	// finds it lost when it renews.
	if _, ok, err := d.AcquirePartition(ctx, ex, c, "a", 1, gone); err != nil || ok {
		t.Errorf("a acquires 1 with an expired lease: %v, %v; want false (not live)", ok, err)
	}
	if l, ok, err := d.AcquirePartition(ctx, ex, c, "b", 1, live); err != nil || !ok || l.Epoch != 2 {
		t.Errorf("b acquires a's expired 1: %+v, %v, %v; want epoch 2, true", l, ok, err)
	}
	lost, err := d.RenewPartitions(ctx, ex, c, "a", []int{0, 1}, live)
	fatalIf(t, err, "a renews")
	if !slices.Equal(lost, []int{1}) {
		t.Errorf("a renews [0 1]: lost %v, want [1]", lost)
	}

	// One's own expired lease is lost at renewal, and taken again with a
	// new epoch.
	if _, ok, err := d.AcquirePartition(ctx, ex, c, "b", 2, gone); err != nil || ok {
		t.Errorf("b acquires 2 expired: %v, %v; want false", ok, err)
	}
	lost, err = d.RenewPartitions(ctx, ex, c, "b", []int{1, 2}, live)
	fatalIf(t, err, "b renews")
	if !slices.Equal(lost, []int{2}) {
		t.Errorf("b renews [1 2] with 2 expired: lost %v, want [2]", lost)
	}
	if l, ok, err := d.AcquirePartition(ctx, ex, c, "b", 2, live); err != nil || !ok || l.Epoch != 2 {
		t.Errorf("b acquires its expired 2 again: %+v, %v, %v; want epoch 2, true", l, ok, err)
	}

	// Release: only the owner's; the epoch stays, the next tenure
	// increments it.
	if ok, err := d.ReleasePartition(ctx, ex, c, "b", 0); err != nil || ok {
		t.Errorf("b releases a's 0: %v, %v; want false", ok, err)
	}
	if ok, err := d.ReleasePartition(ctx, ex, c, "a", 0); err != nil || !ok {
		t.Errorf("a releases 0: %v, %v; want true", ok, err)
	}
	lost, err = d.RenewPartitions(ctx, ex, c, "a", []int{0}, live)
	fatalIf(t, err, "a renews after release")
	if !slices.Equal(lost, []int{0}) {
		t.Errorf("a renews [0] after releasing it: lost %v, want [0]", lost)
	}
	st, err = d.ListGroups(ctx, ex, c)
	fatalIf(t, err, "list partitions")
	want := []string{"stock/0: - epoch 1 free", "stock/1: b epoch 2 live", "stock/2: b epoch 2 live"}
	if got := partitionLines(st); !slices.Equal(got, want) {
		t.Errorf("partitions:\n got %q\nwant %q", got, want)
	}
	if l, ok, err := d.AcquirePartition(ctx, ex, c, "b", 0, live); err != nil || !ok || l.Epoch != 2 {
		t.Errorf("b acquires released 0: %+v, %v, %v; want epoch 2, true", l, ok, err)
	}

	// A renewal extends the held leases only: the member's others are
	// left to expire (a partition it gave up but could not release).
	for _, n := range []int{5, 6} {
		if _, ok, err := d.AcquirePartition(ctx, ex, c, "b", n, live); err != nil || !ok {
			t.Fatalf("b acquires %d: %v, %v", n, ok, err)
		}
	}
	lost, err = d.RenewPartitions(ctx, ex, c, "b", []int{5}, 2*live)
	fatalIf(t, err, "b renews 5 only")
	if len(lost) != 0 {
		t.Errorf("b renews [5]: lost %v, want none", lost)
	}
	st, err = d.ListGroups(ctx, ex, c)
	fatalIf(t, err, "list after renewing 5")
	for _, p := range st.Partitions {
		want := live
		switch p.Partition {
		case 5:
			want = 2 * live
		case 6:
		default:
			continue
		}
		if left := p.Until.Sub(st.Now); left < want-time.Minute || left > want {
			t.Errorf("partition %d: lease ends %v after the database's now, want about %v", p.Partition, left, want)
		}
	}

	// Concurrent takers of one free partition: exactly one wins.
	const takers = 8
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		owners []string
	)
	for i := range takers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			member := fmt.Sprintf("m%d", i)
			_, ok, err := d.AcquirePartition(ctx, ex, c, member, 7, live)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil && db.Driver.Dialect().IsTransient(err):
				// A lost race (deadlock, busy): the caller retries; not an owner.
			case err != nil:
				t.Errorf("%s acquires 7: %v", member, err)
			case ok:
				owners = append(owners, member)
			}
		}()
	}
	wg.Wait()
	if len(owners) != 1 {
		t.Errorf("%d concurrent takers of free partition 7: owners %v, want exactly one", takers, owners)
	}

	// Leaving; every consumer's groups.
	fatalIf(t, d.LeaveGroup(ctx, ex, c, "a"), "a leaves")
	members, err = d.LiveMembers(ctx, ex, c)
	fatalIf(t, err, "live members after leave")
	if !slices.Equal(members, []string{"b"}) {
		t.Errorf("LiveMembers after a left = %v, want [b]", members)
	}
	all, err := d.ListGroups(ctx, ex, "")
	fatalIf(t, err, "list every group")
	if got := memberIDs(all); !slices.Equal(got, []string{"billing/z", "stock/b"}) {
		t.Errorf("every group's members: %v, want [billing/z stock/b]", got)
	}

	// Without migration 0008: a missing table, said so.
	bare := setup.open(t, Options{NoMigrate: true})
	if _, err := bare.Driver.Dialect().ListGroups(ctx, bare.Driver.Pool(), c); !errors.Is(err, idem.ErrMissingTable) {
		t.Errorf("ListGroups without the tables: %v, want idem.ErrMissingTable", err)
	}
}

// memberIDs returns the ids of st's members, prefixed by their consumer
// when st holds several consumers.
func memberIDs(st driver.GroupStatus) []string {
	var out []string
	consumers := map[string]bool{}
	for _, m := range st.Members {
		consumers[m.Consumer] = true
	}
	for _, m := range st.Members {
		if len(consumers) > 1 {
			out = append(out, m.Consumer+"/"+m.ID)
			continue
		}
		out = append(out, m.ID)
	}
	return out
}

// partitionLines describes st's partitions as "consumer/p: owner epoch n
// live|expired|free".
func partitionLines(st driver.GroupStatus) []string {
	var out []string
	for _, p := range st.Partitions {
		state, owner := "expired", p.Owner
		switch {
		case p.Owner == "":
			state, owner = "free", "-"
		case p.Live(st.Now):
			state = "live"
		}
		out = append(out, fmt.Sprintf("%s/%d: %s epoch %d %s", p.Consumer, p.Partition, owner, p.Epoch, state))
	}
	return out
}
