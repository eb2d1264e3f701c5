package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idem-go/idem/monitor"
)

// remoteStatus reads the snapshots of a running dashboard (its
// status.json), for "idem status --dashboard URL".
type remoteStatus struct {
	url    string // of status.json
	client *http.Client
	// token, when set, is sent as a bearer token.
	token string
}

// newRemoteStatus checks the dashboard's URL.
func newRemoteStatus(raw string) (*remoteStatus, error) {
	u, err := url.Parse(raw)
	if err != nil && !strings.Contains(raw, "://") {
		err = nil // said below
	} else if err != nil {
		return nil, err
	}
	if u == nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, errors.New("want the dashboard's http:// or https:// address, such as http://127.0.0.1:9464/dashboard/")
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/status.json"
	u.RawQuery, u.Fragment = "", ""
	return &remoteStatus{url: u.String(), client: &http.Client{Timeout: 30 * time.Second}}, nil
}

// snapshots fetches one snapshot per database of the dashboard. A database
// the dashboard could not read is returned as an error, with the
// snapshots of the others.
func (r *remoteStatus) snapshots(ctx context.Context) ([]monitor.Snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return nil, err
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read the dashboard's status: %w (is the dashboard running at that address?)", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("read the dashboard's status: %w", err)
	}
	if resp.StatusCode == http.StatusUnauthorized {
		return nil, fmt.Errorf("read the dashboard's status: %s answered %s: give its token with --auth-token-file FILE (or $%s)", r.url, resp.Status, dashboardTokenEnv)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read the dashboard's status: %s answered %s (give the dashboard's own address, the page that shows the overview)", r.url, resp.Status)
	}
	var entries []struct {
		monitor.Snapshot
		Error string
	}
	if err := json.Unmarshal(body, &entries); err != nil {
		return nil, fmt.Errorf("read the dashboard's status: %s is not a dashboard's status (%v)", r.url, err)
	}
	out := make([]monitor.Snapshot, 0, len(entries))
	var errs []error
	for _, e := range entries {
		if e.Error != "" {
			errs = append(errs, fmt.Errorf("%s: %s", e.Database, e.Error))
			continue
		}
		out = append(out, e.Snapshot)
	}
	return out, errors.Join(errs...)
}
