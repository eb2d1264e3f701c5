package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/failgroup"
	"github.com/idem-go/idem/internal/textshow"
)

// groupScanLimit bounds the messages the list page reads to show their
// groups: the newest ones. The actions on a group read every message.
const groupScanLimit = scanLimit

// groupsData is the groups section of the messages page.
type groupsData struct {
	Groups  []inbox.FailureGroup
	Scanned int
	// Partial says that the groups are those of the newest Scanned
	// messages only.
	Partial bool
	// Total is the number of messages grouped.
	Total int
}

// groupsOf groups the messages matching f (and source, when not empty),
// newest first, up to groupScanLimit of them.
func groupsOf(ctx context.Context, store *inbox.FailureStore, f idem.FailedFilter, source string) (groupsData, error) {
	var (
		c    inbox.GroupCounter
		data groupsData
	)
	stop := errors.New("enough")
	f.Limit = inbox.FailedPageSizeDefault
	err := store.Pages(ctx, f, func(page []idem.FailedMessage) error {
		for _, m := range page {
			if data.Scanned == groupScanLimit {
				data.Partial = true
				return stop
			}
			data.Scanned++
			if source != "" && m.Source != source {
				continue
			}
			c.Add(m)
			data.Total++
		}
		return nil
	})
	if err != nil && !errors.Is(err, stop) {
		return groupsData{}, err
	}
	data.Groups = c.Groups()
	return data, nil
}

// bulkData is the confirmation page of an action on many messages: those
// of a group, or every message of a consumer.
type bulkData struct {
	DB       string
	Action   string // retry or remove
	Consumer string
	Event    string
	Since    string
	Group    *inbox.FailureGroup
	Count    int
	CanRetry bool
	RetryWhy string
	Path     string // the form's action
	Back     string // the list the action comes from
}

// bulkScope reads the scope of a bulk action from the request (the query
// of the confirmation page, the form of the POST): a consumer, or a group
// (of a consumer, when one is given), narrowed by event and since.
func (d *Dashboard) bulkScope(r *http.Request) (*bulkData, *inbox.FailureStore, idem.FailedFilter, string, error) {
	b := &bulkData{DB: r.PathValue("db"), Action: r.PathValue("action"), Consumer: r.FormValue("consumer"),
		Event: r.FormValue("event"), Since: r.FormValue("since")}
	group := r.FormValue("group")
	store, ok := d.stores[b.DB]
	switch {
	case !ok:
		return nil, nil, idem.FailedFilter{}, "", fmt.Errorf("no database named %q", b.DB)
	case group != "" && !failgroup.ValidID(group):
		return nil, nil, idem.FailedFilter{}, "", fmt.Errorf("%q is not a group id", group)
	case group == "" && b.Consumer == "":
		return nil, nil, idem.FailedFilter{}, "", errors.New("an action on many messages needs a group or a consumer")
	}
	f := idem.FailedFilter{Consumer: b.Consumer, EventName: b.Event}
	var err error
	if f.Since, err = parseSince(b.Since, time.Now()); err != nil {
		return nil, nil, idem.FailedFilter{}, "", err
	}
	v := url.Values{"db": {b.DB}}
	for k, s := range map[string]string{"consumer": b.Consumer, "event": b.Event, "since": b.Since} {
		if s != "" {
			v.Set(k, s)
		}
	}
	b.Back = d.cfg.Path + "messages?" + v.Encode()
	b.Path = fmt.Sprintf("%sbulk/%s/%s", d.cfg.Path, url.PathEscape(b.DB), b.Action)
	return b, store, f, group, nil
}

// canRetryAll says whether the dashboard can re-drive messages, and why
// not.
func (d *Dashboard) canRetryAll() (bool, string) {
	switch {
	case d.cfg.ReadOnly:
		return false, "The dashboard is read-only."
	case d.cfg.Redeliverer == nil:
		return false, "Retrying needs a broker that can send a message back to one queue: start the dashboard with a broker (idem dashboard --broker URL)."
	}
	return true, ""
}

// bulkConfirm shows the confirmation form of an action on a group or on
// every message of a consumer.
func (d *Dashboard) bulkConfirm(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	if action != "retry" && action != "remove" && action != "archive" {
		d.refuse(w, r, http.StatusNotFound, "No such page.")
		return
	}
	if d.cfg.ReadOnly {
		d.refuse(w, r, http.StatusForbidden, "The dashboard is read-only: it neither retries nor removes messages.")
		return
	}
	b, store, f, group, err := d.bulkScope(r)
	if err != nil {
		d.refuse(w, r, http.StatusNotFound, capital(err.Error())+".")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), d.cfg.QueryTimeout)
	defer cancel()
	groups, err := store.Groups(ctx, f)
	if err != nil {
		d.refuse(w, r, http.StatusInternalServerError, explain(err))
		return
	}
	for i := range groups {
		if group == "" {
			b.Count += groups[i].Count
		} else if groups[i].ID == group {
			b.Group, b.Count = &groups[i], groups[i].Count
		}
	}
	if b.Count == 0 {
		d.refuse(w, r, http.StatusNotFound, "No parked message matches any more: applied after a retry, or removed.")
		return
	}
	b.CanRetry, b.RetryWhy = d.canRetryAll()
	status := http.StatusOK
	if action == "retry" && !b.CanRetry {
		status = http.StatusConflict
	}
	title := fmt.Sprintf("%s %d parked message(s)", strings.ToUpper(action[:1])+action[1:], b.Count)
	d.render(w, status, "bulk", page{Title: title, Nav: "messages", CSRF: d.csrfToken(w, r), Data: b})
}

// bulkAct runs a confirmed action on a group or on every message of a
// consumer, audits it and redirects to the list with what was done.
func (d *Dashboard) bulkAct(w http.ResponseWriter, r *http.Request) {
	action := r.PathValue("action")
	if action != "retry" && action != "remove" && action != "archive" {
		d.refuse(w, r, http.StatusNotFound, "No such action.")
		return
	}
	audit := []any{"action", action + " all", "database", r.PathValue("db"), "user", user(r), "remote", r.RemoteAddr}
	if d.cfg.ReadOnly {
		d.log.Warn("dashboard: action refused", append(audit, "result", "refused: read-only")...)
		d.refuse(w, r, http.StatusForbidden, "The dashboard is read-only: it neither retries nor removes messages.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := d.checkPost(r); err != nil {
		d.log.Warn("dashboard: action refused", append(audit, "result", "refused: "+err.Error())...)
		d.refuse(w, r, http.StatusForbidden, "Refused: "+err.Error())
		return
	}
	b, store, f, group, err := d.bulkScope(r)
	if err != nil {
		d.log.Warn("dashboard: action refused", append(audit, "result", "refused: "+err.Error())...)
		d.refuse(w, r, http.StatusNotFound, capital(err.Error())+".")
		return
	}
	audit = append(audit, "consumer", textshow.Printable([]byte(b.Consumer)), "group", group, "event", textshow.Printable([]byte(b.Event)), "since", b.Since)
	store = store.As(user(r))
	// An action runs to its end and is audited, even if the browser goes.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), actionTimeout)
	defer cancel()
	back := url.Values{"db": {b.DB}}
	if b.Consumer != "" {
		back.Set("consumer", b.Consumer)
	}
	switch action {
	case "archive":
		n, err := store.ArchiveGroup(ctx, f, group, nil)
		if err != nil {
			d.log.Error("dashboard: archive all", append(audit, "result", "error", "archived", n, "error", err)...)
			d.refuse(w, r, http.StatusInternalServerError, fmt.Sprintf("Archived %d message(s), then: %s", n, explain(err)))
			return
		}
		d.log.Info("dashboard: archive all", append(audit, "result", "archived", "archived", n)...)
		back.Set("notice", "archived-all")
		back.Set("n", strconv.Itoa(n))
	case "remove":
		n, err := store.RemoveGroup(ctx, f, group, nil)
		if err != nil {
			d.log.Error("dashboard: remove all", append(audit, "result", "error", "removed", n, "error", err)...)
			d.refuse(w, r, http.StatusInternalServerError, fmt.Sprintf("Removed %d message(s), then: %s", n, explain(err)))
			return
		}
		d.log.Info("dashboard: remove all", append(audit, "result", "removed", "removed", n)...)
		back.Set("notice", "removed-all")
		back.Set("n", strconv.Itoa(n))
	case "retry":
		if ok, why := d.canRetryAll(); !ok {
			d.log.Warn("dashboard: retry all", append(audit, "result", "refused: "+why)...)
			d.refuse(w, r, http.StatusConflict, why)
			return
		}
		var failures []string
		held := 0
		found, sent, failed, err := store.RetryGroup(ctx, d.cfg.Redeliverer, f, group, func(m idem.FailedMessage, inGroup bool, err error) {
			switch {
			case err != nil && len(failures) < 10:
				failures = append(failures, fmt.Sprintf("%d: %v", m.ID, err))
			case err == nil && !inGroup:
				held++
			}
		})
		if err == nil && failed > 0 {
			err = fmt.Errorf("%d of %d message(s) not sent: %s", failed, sent+failed, strings.Join(failures, "; "))
		}
		if err != nil {
			d.log.Error("dashboard: retry all", append(audit, "result", "error", "found", found, "sent", sent, "error", err)...)
			d.refuse(w, r, http.StatusBadGateway, fmt.Sprintf("Retry failed after %d message(s) sent: %v", sent, err))
			return
		}
		d.log.Info("dashboard: retry all", append(audit, "result", "sent", "found", found, "sent", sent, "held", held)...)
		back.Set("notice", "retried-all")
		back.Set("n", strconv.Itoa(sent-held))
		back.Set("held", strconv.Itoa(held))
	}
	http.Redirect(w, r, d.cfg.Path+"messages?"+back.Encode(), http.StatusSeeOther)
}

// capital returns s with its first letter upper case.
func capital(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
