package validate

import (
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// TestAlertRules: every rule file of deploy/prometheus is what Prometheus
// loads (rulefmt, as promtool check rules: no unknown field, each
// expression valid PromQL, each template valid), and each alert says how
// bad it is (severity warning or critical) and what to do (summary,
// description). Every metric an expression selects is one of idem's
// (idem_*, checked against the code by package deploy's TestAlertMetrics)
// or up, which Prometheus sets for each scrape.
func TestAlertRules(t *testing.T) {
	files, err := filepath.Glob("../prometheus/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no rule file in deploy/prometheus: %v", err)
	}
	p := parser.NewParser(parser.Options{})
	alerts := map[string]bool{}
	for _, f := range files {
		groups, errs := rulefmt.ParseFile(f, false, model.UTF8Validation, p, slog.New(slog.DiscardHandler))
		for _, err := range errs {
			t.Errorf("%v", err)
		}
		if groups == nil {
			continue
		}
		for _, g := range groups.Groups {
			for _, r := range g.Rules {
				name := r.Alert + r.Record
				where := filepath.Base(f) + ": " + g.Name + ": " + name
				if r.Alert != "" {
					if alerts[r.Alert] {
						t.Errorf("%s: a second alert of that name", where)
					}
					alerts[r.Alert] = true
					if s := r.Labels["severity"]; s != "warning" && s != "critical" {
						t.Errorf("%s: severity %q, want warning or critical", where, s)
					}
					for _, a := range []string{"summary", "description"} {
						if strings.TrimSpace(r.Annotations[a]) == "" {
							t.Errorf("%s: no %s annotation", where, a)
						}
					}
				}
				expr, err := p.ParseExpr(r.Expr)
				if err != nil {
					continue // rulefmt reported it
				}
				parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
					if vs, ok := n.(*parser.VectorSelector); ok && !strings.HasPrefix(vs.Name, "idem_") && vs.Name != "up" {
						t.Errorf("%s: selects %q, neither an idem_ metric nor up", where, vs.String())
					}
					return nil
				})
			}
		}
	}
	for _, want := range []string{"IdemOutboxBacklogOld", "IdemOutboxQuarantined", "IdemConsumerParked", "IdemCDCSlotRetainsWAL", "IdemCDCNotStreaming"} {
		if !alerts[want] {
			t.Errorf("no alert %s (docs/DEPLOYMENT.md and docs/OPERATIONS.md name it)", want)
		}
	}
}
