package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ScrapeTimeoutDefault bounds one read of the endpoints of Scrape.
const ScrapeTimeoutDefault = 5 * time.Second

// Scrape returns a prometheus.Gatherer that reads the Prometheus endpoints
// at urls (text format), for Config.Gatherer when the consumers run in
// other processes ("idem dashboard --metrics http://shop:9090/metrics").
// Families of the same name from several endpoints are merged; the
// dashboard adds up a consumer's histograms, so replicas of a consumer
// count together. An endpoint that fails is left out of that read, and
// Gather returns its error with what the others gave.
func Scrape(client *http.Client, urls ...string) prometheus.Gatherer {
	if client == nil {
		client = &http.Client{Timeout: ScrapeTimeoutDefault}
	}
	return scraper{client: client, urls: slices.Clone(urls)}
}

type scraper struct {
	client *http.Client
	urls   []string
}

// Gather implements prometheus.Gatherer.
func (s scraper) Gather() ([]*dto.MetricFamily, error) {
	byName := map[string]*dto.MetricFamily{}
	var errs []error
	for _, u := range s.urls {
		families, err := s.get(u)
		if err != nil {
			errs = append(errs, fmt.Errorf("idem: dashboard: scrape %s: %w", u, err))
			continue
		}
		for name, f := range families {
			if have, ok := byName[name]; ok && have.GetType() == f.GetType() {
				have.Metric = append(have.Metric, f.Metric...)
				continue
			}
			byName[name] = f
		}
	}
	out := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		out = append(out, f)
	}
	slices.SortFunc(out, func(a, b *dto.MetricFamily) int {
		switch {
		case a.GetName() < b.GetName():
			return -1
		case a.GetName() > b.GetName():
			return 1
		}
		return 0
	})
	return out, errors.Join(errs...)
}

func (s scraper) get(u string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ScrapeTimeoutDefault)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}
