package deploy_test

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idem-go/idem/broker/kafka/kafkametrics"
	"github.com/idem-go/idem/inbox/inboxmetrics"
	"github.com/idem-go/idem/relay/cdc/cdcmetrics"
	"github.com/idem-go/idem/relay/relaymetrics"
)

// collectors are every collector of idem's metrics (docs/OPERATIONS.md,
// "Metrics"): what idem relay, idem cdc and the shop serve, and what an
// application registers for its consumers.
func collectors() []prometheus.Collector {
	return []prometheus.Collector{
		relaymetrics.New(),
		cdcmetrics.New("slot"),
		inboxmetrics.New("consumer", inboxmetrics.Options{}),
		kafkametrics.NewCollector(nil, "group"),
	}
}

// registered returns the name of every metric the collectors describe,
// and the type of those a scrape of fresh collectors shows.
func registered(t *testing.T) (names map[string]bool, types map[string]dto.MetricType) {
	t.Helper()
	names = map[string]bool{}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	for _, c := range collectors() {
		ch := make(chan *prometheus.Desc)
		go func() {
			c.Describe(ch)
			close(ch)
		}()
		for d := range ch {
			m := fqName.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("no name in %s", d)
			}
			names[m[1]] = true
		}
	}
	reg := prometheus.NewPedanticRegistry()
	// The Kafka collector reads a subscriber when scraped: described only.
	reg.MustRegister(collectors()[:3]...)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	types = map[string]dto.MetricType{}
	for _, mf := range mfs {
		types[mf.GetName()] = mf.GetType()
	}
	return names, types
}

// TestAlertMetrics: every idem_ metric the alert rules of deploy/prometheus
// name, in an expression or an annotation, is one the collectors register
// (a histogram's _bucket, _sum and _count series included), so that a
// renamed or removed metric cannot leave an alert that never fires; and
// the rules cover the relays, the CDC relay and the consumers.
func TestAlertMetrics(t *testing.T) {
	t.Parallel()
	names, types := registered(t)
	if len(names) < 40 {
		t.Fatalf("the collectors describe %d metrics: the test would check nothing", len(names))
	}
	files, err := filepath.Glob("prometheus/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no rule file in deploy/prometheus: %v", err)
	}
	metric := regexp.MustCompile(`\bidem_[a-z0-9_]+`)
	used := map[string]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range metric.FindAllString(string(b), -1) {
			if !known(name, names, types) {
				t.Errorf("%s names %s, which no collector registers", f, name)
			}
			used[name] = true
		}
	}
	for _, prefix := range []string{"idem_relay_", "idem_cdc_", "idem_consumer_"} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(used)), func(n string) bool { return strings.HasPrefix(n, prefix) }) {
			t.Errorf("no alert rule on the %s* metrics", prefix)
		}
	}
}

// known reports whether name is a registered metric or a series of a
// registered histogram.
func known(name string, names map[string]bool, types map[string]dto.MetricType) bool {
	if names[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok || !names[base] {
			continue
		}
		// A labelled histogram without series yet has no type: its name
		// says what it is (not a counter).
		typ, scraped := types[base]
		if scraped && typ == dto.MetricType_HISTOGRAM || !scraped && !strings.HasSuffix(base, "_total") {
			return true
		}
	}
	return false
}
