package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/fault"
	"github.com/idem-go/idem/internal/mutant"
	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
	"github.com/idem-go/idem/internal/tools/shopkit"
)

// mutantShop is the shop built with its known bugs (build tag idemmutant),
// built once by the first test that needs it.
var mutantShop struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

func mutantBinary(t *testing.T) string {
	t.Helper()
	mutantShop.once.Do(func() {
		mutantShop.path = filepath.Join(binDir, "shop-mutant")
		// With -race, as the shop of the other tests: the packages that
		// do not import internal/mutant are built already.
		mutantShop.out, mutantShop.err = exec.Command("go", "build", "-race", "-tags", fault.Tag+","+mutant.Tag, "-o", mutantShop.path, shopPackage).CombinedOutput()
	})
	if mutantShop.err != nil {
		t.Fatalf("build the mutant shop: %v\n%s", mutantShop.err, mutantShop.out)
	}
	return mutantShop.path
}

// TestChaosCatchesMutants runs a short random run of the shop with each
// known bug (internal/mutant) and checks that the verdict fails on the
// check that guards against it, with an observation that names the bug's
// effect: the checker is trusted for these bugs because it caught them.
func TestChaosCatchesMutants(t *testing.T) {
	t.Parallel()
	bin := mutantBinary(t)
	for _, tc := range []struct {
		mutant string
		relay  string
		// check is the start of the check that must fail, whose
		// observation must contain want; or, when set, the start of
		// another check and its words (also, alsoWant) that name the
		// same bug's other effect.
		check, want, also, alsoWant string
		// hold has the run hold the commits of a PostgreSQL server of
		// its own (a G13 window as long as the test needs).
		hold bool
		// noReplay leaves the replay fault out: it publishes every
		// event again, which delivers an event lost before it, and a
		// loss then depends on a later kill meeting the bug's window.
		noReplay bool
	}{
		{mutant: mutant.InboxSkipDedup + "=order", check: "exactly once", want: "order applied shipping."},
		{mutant: mutant.InboxAckBeforeCommit, check: "nothing lost", want: "never applied", noReplay: true},
		{mutant: mutant.RelayDropOne, check: "nothing lost", want: "never applied", noReplay: true},
		{mutant: mutant.RelaySwap, check: "order:", want: "v1) after"},
		// Publishing before the commit is visible shows as a consumer
		// not finding the row when one reads it in the window, and as the
		// relay's delete, run in the window too, missing the row it
		// published: either names the bug, and which one a short run
		// meets depends on when the commits are held.
		{mutant: mutant.CDCSkipVisibility, relay: shopkit.RelayCDC, check: "G13", want: "did not find the row",
			also: "nothing quarantined or left behind", alsoWant: "published and archived, still in the outbox", hold: true},
	} {
		t.Run(tc.mutant, func(t *testing.T) {
			t.Parallel()
			o := randomOptions{Binary: bin, Broker: testamqp.URL(t), Relay: tc.relay, Replicas: 1, Duration: 10 * time.Second,
				Settle: 30 * time.Second, NoReplay: tc.noReplay, ExtraEnv: []string{mutant.EnvVar + "=" + tc.mutant}}
			if tc.hold {
				srv := testdb.StartServer(t, "max_connections = 200")
				db := &shopkit.DBServer{URL: srv.URL, Start: srv.StartCommand()}
				o.DB, o.Servers = srv.URL, []serverTarget{{Name: db.Name(), Hold: db.HoldCommits}}
			} else {
				o.DB = testdb.PostgresURL(t)
			}
			o = shortRandom(t, o)
			o.Settle = 30 * time.Second
			rep := runShort(t, o)
			caught := func(check, want string) (bool, string) {
				for _, c := range rep.Checks {
					if strings.HasPrefix(c.What, check) {
						return !c.OK && !c.NotRun && strings.Contains(c.Observed, want),
							fmt.Sprintf("the check %q gives %q (ok %v, not run %v)", c.What, c.Observed, c.OK, c.NotRun)
					}
				}
				return false, fmt.Sprintf("no check %q in the verdict", check)
			}
			ok, got := caught(tc.check, tc.want)
			if !ok && tc.also != "" {
				var alsoGot string
				if ok, alsoGot = caught(tc.also, tc.alsoWant); !ok {
					got += "; " + alsoGot
				}
			}
			if !ok {
				t.Errorf("with %s, %s; want a failure saying %q", tc.mutant, got, tc.want)
			}
		})
	}
}
