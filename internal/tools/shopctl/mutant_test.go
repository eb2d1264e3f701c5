package main

import (
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
		// observation must contain want.
		check, want string
		// hold has the run hold the commits of a PostgreSQL server of
		// its own (a G13 window as long as the test needs).
		hold bool
	}{
		{mutant: mutant.InboxSkipDedup + "=order", check: "exactly once", want: "order applied shipping."},
		{mutant: mutant.InboxAckBeforeCommit, check: "nothing lost", want: "never applied"},
		{mutant: mutant.RelayDropOne, check: "nothing lost", want: "never applied"},
		{mutant: mutant.RelaySwap, check: "order:", want: "v1) after"},
		{mutant: mutant.CDCSkipVisibility, relay: shopkit.RelayCDC, check: "G13", want: "did not find the row", hold: true},
	} {
		t.Run(tc.mutant, func(t *testing.T) {
			t.Parallel()
			o := randomOptions{Binary: bin, Broker: testamqp.URL(t), Relay: tc.relay, Replicas: 1, Duration: 10 * time.Second,
				Settle: 30 * time.Second, ExtraEnv: []string{mutant.EnvVar + "=" + tc.mutant}}
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
			for _, c := range rep.Checks {
				if strings.HasPrefix(c.What, tc.check) {
					if c.OK || c.NotRun || !strings.Contains(c.Observed, tc.want) {
						t.Errorf("with %s, the check %q gives %q (ok %v, not run %v), want a failure saying %q", tc.mutant, c.What, c.Observed, c.OK, c.NotRun, tc.want)
					}
					return
				}
			}
			t.Errorf("no check %q in the verdict", tc.check)
		})
	}
}
