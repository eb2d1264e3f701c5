package dashboard

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/textshow"
	"github.com/idem-go/idem/monitor"
)

// page is what every template receives.
type page struct {
	Title    string
	Base     string
	Nav      string
	ReadOnly bool
	Refresh  int
	Notice   string
	CSRF     string
	Data     any
}

var funcs = template.FuncMap{
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"age": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return ago(time.Since(t))
	},
	"since": func(t time.Time) string {
		if t.IsZero() {
			return "–"
		}
		return ago(time.Since(t))
	},
	"text":  func(s string) string { return textshow.Printable([]byte(s)) },
	"short": func(s string, n int) string { return textshow.OneLine(textshow.Printable([]byte(s)), n) },
	"path":  url.PathEscape,
	"query": url.QueryEscape,
	"eventID": func(m idem.FailedMessage) string {
		if m.EventID == [16]byte{} {
			return "–"
		}
		return m.EventID.String()
	},
	"waiting": func(c overviewConsumer) string {
		if !c.Broker {
			return "–"
		}
		var parts []string
		if c.Lag >= 0 {
			parts = append(parts, fmt.Sprintf("lag %d", c.Lag))
		}
		if c.Ready >= 0 {
			parts = append(parts, fmt.Sprintf("%d ready", c.Ready))
		}
		if c.Unacked >= 0 {
			parts = append(parts, fmt.Sprintf("%d unacked", c.Unacked))
		}
		if len(parts) == 0 {
			return "–"
		}
		return strings.Join(parts, ", ")
	},
}

func ago(d time.Duration) string {
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds ago", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm ago", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// render writes a page, or a plain 500 when the template fails.
func (d *Dashboard) render(w http.ResponseWriter, status int, name string, p page) {
	p.Base = d.cfg.Path
	p.ReadOnly = d.cfg.ReadOnly
	var buf bytes.Buffer
	if err := d.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		d.log.Error("dashboard: render", "page", name, "error", err)
		http.Error(w, "idem dashboard: cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// refuse renders an error page.
func (d *Dashboard) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	d.render(w, status, "error", page{Title: http.StatusText(status), Data: msg})
}

// ---------------------------------------------------------------- overview

type overviewDB struct {
	Name        string
	Err         string
	Taken       time.Time
	Outbox      monitor.OutboxStatus
	Consumers   []overviewConsumer
	BrokerError string
	Partitions  []overviewPartition
	Pauses      []overviewPause
	OutboxName  string // the outbox table, without its schema
	Charts      []template.HTML
}

// overviewPartition is a partition of a consumer's ownership group
// (inbox.Group), as the overview shows it.
type overviewPartition struct {
	monitor.PartitionStatus
	Lease   string // "4s left", "expired 10s ago", "free"
	Waiting string // in the partition's queue; "–" when unknown
}

// span prints a lease's time left or past: 850ms, 4s, 3m20s, 5h02m.
func span(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
}

// partitionRows formats the partitions of a snapshot.
func partitionRows(ps []monitor.PartitionStatus) []overviewPartition {
	out := make([]overviewPartition, 0, len(ps))
	for _, p := range ps {
		op := overviewPartition{PartitionStatus: p, Lease: "free", Waiting: "–"}
		switch {
		case p.Owner == "":
		case p.Live():
			op.Lease = span(p.LeaseLeft) + " left"
		default:
			op.Lease = "expired " + span(-p.LeaseLeft) + " ago"
		}
		if p.Queue != nil && p.Queue.Waiting() >= 0 {
			op.Waiting = fmt.Sprint(p.Queue.Waiting())
		}
		out = append(out, op)
	}
	return out
}

type overviewConsumer struct {
	monitor.ConsumerStatus
	Known     bool // found in the database (not only in the broker)
	Broker    bool
	Ready     int64
	Unacked   int64
	Lag       int64
	P50, P99  string
	Sparkline template.HTML
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	snaps := d.snapshots(r.Context())
	hist := d.hist.snapshot()
	var dbs []overviewDB
	for i, db := range d.cfg.Databases {
		res := snaps[i]
		o := overviewDB{Name: db.Name, OutboxName: db.Store.Dialect().Tables().Outbox}
		if res.err != nil {
			o.Err = explain(res.err)
			o.Charts = d.dbCharts(db.Name, hist)
			dbs = append(dbs, o)
			continue
		}
		o.Taken, o.Outbox, o.BrokerError = res.snap.Taken, res.snap.Outbox, res.snap.BrokerError
		o.Partitions = partitionRows(res.snap.Partitions)
		for _, p := range res.snap.Pauses {
			state := "scheduled"
			if p.ActiveAt(res.snap.Taken) {
				state = "active"
			}
			o.Pauses = append(o.Pauses, overviewPause{Pause: p, State: state})
		}
		queues := map[string]broker.QueueStats{}
		for _, q := range res.snap.Queues {
			queues[q.Consumer] = q
		}
		for _, c := range res.snap.Consumers {
			oc := overviewConsumer{ConsumerStatus: c, Known: true, P50: "–", P99: "–"}
			if q, ok := queues[c.Name]; ok {
				oc.Broker, oc.Ready, oc.Unacked, oc.Lag = true, q.Ready, q.Unacked, q.Lag
				delete(queues, c.Name)
			}
			if d.cfg.Gatherer != nil {
				p50, p99 := d.hist.recentQuantiles(db.Name, c.Name)
				oc.P50, oc.P99 = formatSeconds(p50), formatSeconds(p99)
			}
			oc.Sparkline = d.consumerSparkline(db.Name, c.Name, hist)
			o.Consumers = append(o.Consumers, oc)
		}
		// Queues of consumers the database does not know (yet).
		rest := make([]string, 0, len(queues))
		for name := range queues {
			rest = append(rest, name)
		}
		slices.Sort(rest)
		for _, name := range rest {
			q := queues[name]
			o.Consumers = append(o.Consumers, overviewConsumer{ConsumerStatus: monitor.ConsumerStatus{Name: name},
				Broker: true, Ready: q.Ready, Unacked: q.Unacked, Lag: q.Lag, P50: "–", P99: "–"})
		}
		o.Charts = d.dbCharts(db.Name, hist)
		dbs = append(dbs, o)
	}
	refresh := int(math.Ceil(d.cfg.SampleInterval.Seconds()))
	d.render(w, http.StatusOK, "overview", page{Title: "Overview", Nav: "overview", Refresh: refresh, Data: dbs})
}

// dbCharts returns the charts of one database over the samples.
func (d *Dashboard) dbCharts(name string, hist []sample) []template.HTML {
	times := make([]time.Time, len(hist))
	get := func(f func(dbSample) float64) []float64 {
		out := make([]float64, len(hist))
		for i, s := range hist {
			times[i] = s.at
			ds, ok := s.dbs[name]
			if !ok || !ds.ok {
				out[i] = math.NaN()
				continue
			}
			out[i] = f(ds)
		}
		return out
	}
	backlog := get(func(s dbSample) float64 {
		if !s.outbox {
			return math.NaN()
		}
		return float64(s.backlog)
	})
	quarantined := get(func(s dbSample) float64 {
		if !s.outbox {
			return math.NaN()
		}
		return float64(s.quarantined)
	})
	processed := get(func(s dbSample) float64 { return float64(s.processed) })
	parked := get(func(s dbSample) float64 { return float64(s.parked) })
	p50 := get(func(s dbSample) float64 { return s.p50 })
	p99 := get(func(s dbSample) float64 { return s.p99 })
	span := fitSpan(times, d.cfg.SampleInterval, d.cfg.History)
	charts := []chart{
		{title: "Outbox backlog", times: times, span: span, series: []series{{"unpublished", "s0", backlog}, {"quarantined", "s3", quarantined}}},
		{title: "Processed per minute", times: times, span: span, series: []series{{"every consumer", "s1", processed}}},
		{title: "Parked messages", times: times, span: span, series: []series{{"parked", "s3", parked}}},
	}
	if d.cfg.Gatherer != nil {
		charts = append(charts, chart{title: "Commit to handle", unit: "s", times: times, span: span,
			series: []series{{"p50", "s1", p50}, {"p99", "s2", p99}}})
	}
	out := make([]template.HTML, len(charts))
	for i, c := range charts {
		out[i] = c.svg()
	}
	return out
}

// consumerSparkline is a one-line chart of a consumer's processing rate.
func (d *Dashboard) consumerSparkline(db, consumer string, hist []sample) template.HTML {
	times := make([]time.Time, len(hist))
	vals := make([]float64, len(hist))
	for i, s := range hist {
		times[i] = s.at
		cs, ok := s.dbs[db].consumers[consumer]
		if !ok {
			vals[i] = math.NaN()
			continue
		}
		vals[i] = float64(cs.processed)
	}
	return sparkline(times, vals, fitSpan(times, d.cfg.SampleInterval, d.cfg.History))
}

// statusJSON serves the snapshots of every database, as "idem status
// --json" prints them.
func (d *Dashboard) statusJSON(w http.ResponseWriter, r *http.Request) {
	type entry struct {
		monitor.Snapshot
		Error string `json:",omitempty"`
	}
	snaps := d.snapshots(r.Context())
	out := make([]entry, len(snaps))
	for i, s := range snaps {
		out[i] = entry{Snapshot: s.snap, Error: explain(s.err)}
		out[i].Database = d.cfg.Databases[i].Name
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(out)
}

// ---------------------------------------------------------------- messages

type listData struct {
	Groups    groupsData
	Bulk      template.URL // the query of the bulk actions: the list's consumer, event and since, encoded
	DBs       []string
	DB        string
	Consumer  string
	Event     string
	Source    string
	Since     string
	HeldBy    string
	Consumers []string
	Rows      []idem.FailedMessage
	Next      string
	First     string
	Err       string
	Scanned   int
	// Archived lists the archived messages instead (no groups, no bulk
	// actions); Toggle links to the other list.
	Archived bool
	Toggle   string
}

// scanLimit bounds the entries a page reads when filtering by source,
// which the failure store cannot select itself.
const scanLimit = 20 * inbox.FailedPageSizeDefault

func (d *Dashboard) messages(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	data := listData{DB: q.Get("db"), Consumer: q.Get("consumer"), Event: q.Get("event"), Source: q.Get("source"),
		Since: q.Get("since"), HeldBy: q.Get("held_by")}
	for _, db := range d.cfg.Databases {
		data.DBs = append(data.DBs, db.Name)
	}
	if data.DB == "" {
		data.DB = data.DBs[0]
	}
	store, ok := d.stores[data.DB]
	p := page{Title: "Parked messages", Nav: "messages", Notice: notice(q), Data: &data}
	if !ok {
		data.Err = fmt.Sprintf("No database named %q.", data.DB)
		d.render(w, http.StatusNotFound, "messages", p)
		return
	}
	data.Archived = q.Get("archived") == "1"
	filter := idem.FailedFilter{Consumer: data.Consumer, EventName: data.Event, Archived: data.Archived}
	var err error
	if filter.Since, err = parseSince(data.Since, time.Now()); err != nil {
		data.Err = err.Error()
		d.render(w, http.StatusBadRequest, "messages", p)
		return
	}
	if data.HeldBy != "" {
		if filter.HeldBy, err = strconv.ParseInt(data.HeldBy, 10, 64); err != nil || filter.HeldBy <= 0 {
			data.Err = fmt.Sprintf("held by %q: want a message ID.", data.HeldBy)
			d.render(w, http.StatusBadRequest, "messages", p)
			return
		}
	}
	if b := q.Get("before"); b != "" {
		if filter.BeforeID, err = strconv.ParseInt(b, 10, 64); err != nil || filter.BeforeID <= 0 {
			data.Err = fmt.Sprintf("before %q: want a message ID.", b)
			d.render(w, http.StatusBadRequest, "messages", p)
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), d.cfg.QueryTimeout)
	defer cancel()
	rows, next, scanned, err := d.listPage(ctx, store, filter, data.Source)
	if err != nil {
		data.Err = explain(err)
		d.render(w, http.StatusInternalServerError, "messages", p)
		return
	}
	data.Rows, data.Scanned = rows, scanned
	groupFilter := filter
	groupFilter.BeforeID = 0
	if data.Archived {
		p.Title = "Archived messages"
	} else if data.Groups, err = groupsOf(ctx, store, groupFilter, data.Source); err != nil {
		data.Err = explain(err)
		d.render(w, http.StatusInternalServerError, "messages", p)
		return
	}
	bulk := url.Values{}
	for k, s := range map[string]string{"consumer": data.Consumer, "event": data.Event, "since": data.Since} {
		if s != "" {
			bulk.Set(k, s)
		}
	}
	data.Bulk = template.URL(bulk.Encode()) // url.Values.Encode escapes every value
	link := func(before int64, archived bool) string {
		v := url.Values{"db": {data.DB}}
		for k, s := range map[string]string{"consumer": data.Consumer, "event": data.Event, "source": data.Source, "since": data.Since, "held_by": data.HeldBy} {
			if s != "" {
				v.Set(k, s)
			}
		}
		if before > 0 {
			v.Set("before", strconv.FormatInt(before, 10))
		}
		if archived {
			v.Set("archived", "1")
		}
		return d.cfg.Path + "messages?" + v.Encode()
	}
	data.Toggle = link(0, !data.Archived)
	if next > 0 {
		data.Next = link(next, data.Archived)
	}
	if filter.BeforeID > 0 {
		data.First = link(0, data.Archived)
	}
	if snap, err := d.cfg.Databases[slices.Index(data.DBs, data.DB)].Source.Snapshot(ctx); err == nil {
		for _, c := range snap.Consumers {
			data.Consumers = append(data.Consumers, c.Name)
		}
	}
	d.render(w, http.StatusOK, "messages", p)
}

// listPage reads one page of parked messages, newest first, and returns
// the cursor of the next page (0 when none follows). Without a source
// filter the store selects; with one, pages are read and filtered here, up
// to scanLimit entries per page.
func (d *Dashboard) listPage(ctx context.Context, store *inbox.FailureStore, f idem.FailedFilter, source string) (rows []idem.FailedMessage, next int64, scanned int, err error) {
	size := d.cfg.PageSize
	if source == "" {
		f.Limit = size + 1
		rows, err = store.List(ctx, f)
		if len(rows) > size {
			return rows[:size], rows[size-1].ID, len(rows), err
		}
		return rows, 0, len(rows), err
	}
	f.Limit = inbox.FailedPageSizeDefault
	stop := errors.New("enough")
	err = store.Pages(ctx, f, func(page []idem.FailedMessage) error {
		for _, m := range page {
			if m.Source == source {
				if len(rows) == size {
					return stop
				}
				rows = append(rows, m)
			}
			scanned++
			next = m.ID
			if scanned >= scanLimit {
				return stop
			}
		}
		return nil
	})
	if errors.Is(err, stop) {
		return rows, next, scanned, nil
	}
	return rows, 0, scanned, err
}

// parseSince accepts what "idem failed list --since" does: an RFC 3339
// time, a date, or a duration back from now.
func parseSince(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	if dur, err := time.ParseDuration(s); err == nil && dur >= 0 {
		return now.Add(-dur), nil
	}
	return time.Time{}, fmt.Errorf("since %q: want an RFC 3339 time (2026-12-02T08:00:00Z), a date (2026-12-02) or a duration back from now (90m)", s)
}

// notice is the message shown after an action, rebuilt from the redirect's
// query (numbers only: nothing the query holds is echoed as text).
func notice(q url.Values) string {
	id, _ := strconv.ParseInt(q.Get("id"), 10, 64)
	switch q.Get("notice") {
	case "retried":
		sent, _ := strconv.Atoi(q.Get("sent"))
		msg := fmt.Sprintf("Message %d was sent back to its queue.", id)
		if sent > 1 {
			msg = fmt.Sprintf("Message %d was sent back to its queue, followed by the %d message(s) held behind it.", id, sent-1)
		}
		return msg + " The consumer removes it from the store once it is applied; if it fails again, it is parked again here."
	case "removed":
		return fmt.Sprintf("Message %d was removed from the store. Messages held behind it stay, to retry or remove.", id)
	case "retried-all":
		n, _ := strconv.Atoi(q.Get("n"))
		held, _ := strconv.Atoi(q.Get("held"))
		msg := fmt.Sprintf("%d message(s) were sent back to their queues", n)
		if held > 0 {
			msg += fmt.Sprintf(", followed by the %d message(s) held behind them", held)
		}
		return msg + ". The consumer removes each from the store once it is applied; those that fail again are parked again here."
	case "removed-all":
		n, _ := strconv.Atoi(q.Get("n"))
		return fmt.Sprintf("%d message(s) were removed from the store. Messages held behind them stay, to retry or remove.", n)
	}
	return operationNotice(q)
}

// ---------------------------------------------------------------- message

type messageData struct {
	DB       string
	M        idem.FailedMessage
	BodyText string
	BodyHex  string
	Headers  [][2]string
	Held     []idem.FailedMessage
	HeldMore bool
	CanRetry bool
	RetryWhy string
	// CanRedirect and RedirectWhy say whether the message can be sent to
	// another consumer (canRedirect).
	CanRedirect bool
	RedirectWhy string
	Action      string // on the confirmation page: retry or remove
	ActionPath  string
	Original    *shownOriginal // the message as received, when it was edited
}

// load reads the message named by the request's path, or renders why not.
func (d *Dashboard) load(w http.ResponseWriter, r *http.Request) (*messageData, *inbox.FailureStore, bool) {
	db := r.PathValue("db")
	store, ok := d.stores[db]
	if !ok {
		d.refuse(w, r, http.StatusNotFound, fmt.Sprintf("No database named %q.", db))
		return nil, nil, false
	}
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		d.refuse(w, r, http.StatusNotFound, fmt.Sprintf("%q is not a message ID.", r.PathValue("id")))
		return nil, nil, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), d.cfg.QueryTimeout)
	defer cancel()
	m, err := store.Get(ctx, id)
	if q := r.URL.Query(); errors.Is(err, idem.ErrNotFound) && q.Get("notice") == "retried" && r.Method == http.MethodGet {
		// Retried and already applied by the time the page loads: say
		// so on the list rather than as an error.
		back := url.Values{"notice": {"retried"}, "id": {strconv.FormatInt(id, 10)}, "sent": {q.Get("sent")}}
		http.Redirect(w, r, d.cfg.Path+"messages?"+back.Encode(), http.StatusSeeOther)
		return nil, nil, false
	}
	if errors.Is(err, idem.ErrNotFound) {
		d.refuse(w, r, http.StatusNotFound, fmt.Sprintf("No parked message %d in %s: it was applied after a retry, or removed.", id, db))
		return nil, nil, false
	}
	if err != nil {
		d.refuse(w, r, http.StatusInternalServerError, explain(err))
		return nil, nil, false
	}
	data := &messageData{DB: db, M: m}
	data.CanRetry, data.RetryWhy = d.canRetry(m)
	data.CanRedirect, data.RedirectWhy = d.canRedirect()
	held, err := store.List(ctx, idem.FailedFilter{HeldBy: m.ID, Oldest: true, Limit: 21})
	if err == nil {
		if len(held) > 20 {
			held, data.HeldMore = held[:20], true
		}
		data.Held = held
	}
	return data, store, true
}

// canRetry says whether m can be re-driven from the dashboard, and why not.
func (d *Dashboard) canRetry(m idem.FailedMessage) (bool, string) {
	switch {
	case d.cfg.ReadOnly:
		return false, "The dashboard is read-only."
	case d.cfg.Redeliverer == nil:
		return false, "Retrying needs a broker that can send a message back to one queue: start the dashboard with a broker (idem dashboard --broker URL)."
	case m.Source == "":
		return false, "The queue this message came from is unknown: republish it with your broker's tools."
	}
	return true, ""
}

func (d *Dashboard) message(w http.ResponseWriter, r *http.Request) {
	data, _, ok := d.load(w, r)
	if !ok {
		return
	}
	m := data.M
	if textshow.IsText(m.Body) {
		data.BodyText = string(m.Body)
	} else {
		data.BodyHex = hex.Dump(m.Body)
	}
	for k, v := range m.Headers {
		data.Headers = append(data.Headers, [2]string{k, v})
	}
	slices.SortFunc(data.Headers, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	data.Original = showOriginal(m)
	d.render(w, http.StatusOK, "message", page{Title: fmt.Sprintf("Message %d", m.ID), Nav: "messages",
		Notice: notice(r.URL.Query()), Data: data})
}

// confirm shows the confirmation form of an action.
func (d *Dashboard) confirm(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	if action != "retry" && action != "remove" && !isOperation(action) {
		d.refuse(w, r, http.StatusNotFound, "No such page.")
		return
	}
	if d.cfg.ReadOnly {
		d.refuse(w, r, http.StatusForbidden, "The dashboard is read-only: it neither retries nor removes messages.")
		return
	}
	if isOperation(action) {
		d.operationConfirm(w, r, action)
		return
	}
	data, _, ok := d.load(w, r)
	if !ok {
		return
	}
	data.Action = action
	data.ActionPath = fmt.Sprintf("%smessages/%s/%d/%s", d.cfg.Path, url.PathEscape(data.DB), data.M.ID, action)
	status := http.StatusOK
	if action == "retry" && !data.CanRetry {
		status = http.StatusConflict
	}
	d.render(w, status, "confirm", page{Title: fmt.Sprintf("%s message %d", strings.ToUpper(action[:1])+action[1:], data.M.ID),
		Nav: "messages", CSRF: d.csrfToken(w, r), Data: data})
}

// actionTimeout bounds a retry or a remove.
const actionTimeout = time.Minute

// act runs a confirmed action, audits it and redirects to what follows.
func (d *Dashboard) act(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	if action != "retry" && action != "remove" && !isOperation(action) {
		d.refuse(w, r, http.StatusNotFound, "No such action.")
		return
	}
	audit := []any{"action", action, "database", r.PathValue("db"), "id", r.PathValue("id"), "user", user(r), "remote", r.RemoteAddr}
	if d.cfg.ReadOnly {
		d.log.Warn("dashboard: action refused", append(audit, "result", "refused: read-only")...)
		d.refuse(w, r, http.StatusForbidden, "The dashboard is read-only: it neither retries nor removes messages.")
		return
	}
	limit := int64(64 << 10)
	if action == "edit" {
		limit = editBodyMax
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	if err := d.checkPost(r); err != nil {
		d.log.Warn("dashboard: action refused", append(audit, "result", "refused: "+err.Error())...)
		d.refuse(w, r, http.StatusForbidden, "Refused: "+err.Error())
		return
	}
	data, store, ok := d.load(w, r)
	if !ok {
		d.log.Warn("dashboard: action refused", append(audit, "result", "refused: no such message")...)
		return
	}
	m := data.M
	store = store.As(user(r))
	// An action runs to its end and is audited, even if the browser goes.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), actionTimeout)
	defer cancel()
	audit = append(audit, "consumer", textshow.Printable([]byte(m.Consumer)), "event", textshow.Printable([]byte(m.EventName)), "event_id", m.EventID.String())
	if isOperation(action) {
		d.operationAct(ctx, w, r, action, audit, data, store)
		return
	}
	dbPath := url.PathEscape(data.DB)
	switch action {
	case "remove":
		removed, err := store.Remove(ctx, m.ID)
		if err != nil {
			d.log.Error("dashboard: remove", append(audit, "result", "error", "error", err)...)
			d.refuse(w, r, http.StatusInternalServerError, "Not removed: "+explain(err))
			return
		}
		d.log.Info("dashboard: remove", append(audit, "result", map[bool]string{true: "removed", false: "already gone"}[removed])...)
		http.Redirect(w, r, fmt.Sprintf("%smessages?db=%s&notice=removed&id=%d", d.cfg.Path, url.QueryEscape(data.DB), m.ID), http.StatusSeeOther)
	case "retry":
		if ok, why := d.canRetry(m); !ok {
			d.log.Warn("dashboard: retry", append(audit, "result", "refused: "+why)...)
			d.refuse(w, r, http.StatusConflict, why)
			return
		}
		var failures []string
		sent, failed, err := store.Retry(ctx, d.cfg.Redeliverer, m, func(h idem.FailedMessage, err error) {
			if err != nil {
				failures = append(failures, fmt.Sprintf("%d: %v", h.ID, err))
			}
		})
		if err == nil && failed > 0 {
			err = fmt.Errorf("%d of %d message(s) not sent: %s", failed, sent+failed, strings.Join(failures, "; "))
		}
		if err != nil {
			d.log.Error("dashboard: retry", append(audit, "result", "error", "sent", sent, "error", err)...)
			d.refuse(w, r, http.StatusBadGateway, "Retry failed: "+err.Error())
			return
		}
		d.log.Info("dashboard: retry", append(audit, "result", "sent", "sent", sent, "source", textshow.Printable([]byte(m.Source)))...)
		http.Redirect(w, r, fmt.Sprintf("%smessages/%s/%d?notice=retried&id=%d&sent=%d", d.cfg.Path, dbPath, m.ID, m.ID, sent), http.StatusSeeOther)
	}
}

// ---------------------------------------------------------------- text
