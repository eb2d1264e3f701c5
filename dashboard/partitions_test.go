package dashboard_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/inbox"
)

// nopSubscriber stands for a transport's subscriber of one partition.
type nopSubscriber struct{}

func (nopSubscriber) Start(context.Context) error { return nil }
func (nopSubscriber) Stop(context.Context) error  { return nil }

// TestOverviewPartitions: the overview shows the partitions of a consumer
// shared by replicas (inbox.Group), each with its owner and lease.
func TestOverviewPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c, err := inbox.New(b.pg.Driver, inbox.Config{Name: "stock"})
	if err != nil {
		t.Fatal(err)
	}
	g, err := inbox.NewGroup(c, inbox.GroupConfig{Partitions: 2, MemberID: "replica-1",
		Subscriber: func(int) (broker.Subscriber, error) { return nopSubscriber{}, nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Stop(context.Background()) })
	deadline := time.Now().Add(30 * time.Second)
	for len(g.Owned()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the group owns %v after 30s, want [0 1]", g.Owned())
		}
		time.Sleep(10 * time.Millisecond)
	}

	code, page := b.get(t, "/dashboard/")
	if code != http.StatusOK {
		t.Fatalf("overview: %d\n%s", code, page)
	}
	for _, p := range []string{"0", "1"} {
		anchor := `data-consumer="stock" data-partition="` + p + `"`
		if got := figure(t, page, anchor, "owner"); got != "replica-1" {
			t.Errorf("partition %s: owner %q, want replica-1", p, got)
		}
		if got := figure(t, page, anchor, "lease"); !regexp.MustCompile(`^\d+(ms|s) left$`).MatchString(got) {
			t.Errorf("partition %s: lease %q, want the time left", p, got)
		}
	}
	code, js := b.get(t, "/dashboard/status.json")
	if code != http.StatusOK || !strings.Contains(js, `"Owner": "replica-1"`) {
		t.Errorf("status.json: %d, want the partitions' owner\n%s", code, js)
	}
}
