package dashboard

import (
	"context"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/textshow"
)

// The operators' actions on a parked message beyond retry and remove:
// edit its body and headers, send it to another consumer (redirect), or
// archive it. Each is confirmed on a form, audited in the log and in the
// entry's audit trail with the authenticated user.

// isOperation reports whether action is one of these.
func isOperation(action string) bool {
	return action == "edit" || action == "redirect" || action == "archive"
}

// operationData is what the operation page receives.
type operationData struct {
	*messageData
	// Body and Headers are the edit form's fields: the message's body as
	// text, its headers one "name: value" per line.
	Body, Headers string
	// CanEdit is false for a body that is not text, which the form cannot
	// hold: EditWhy says to use the command line.
	CanEdit bool
	EditWhy string
	// Consumers are the database's, to choose from when sending the
	// message to another one.
	Consumers []string
}

// editBodyMax bounds an edit form, the body and headers posted; the other
// forms hold 64 KiB.
const editBodyMax = 8 << 20

// canRedirect says whether a message can be sent to another consumer from
// the dashboard, and why not.
func (d *Dashboard) canRedirect() (bool, string) {
	switch {
	case d.cfg.ReadOnly:
		return false, "The dashboard is read-only."
	case d.cfg.ConsumerPublisher == nil:
		return false, "Sending a message to another consumer needs a broker that can publish to one consumer only (RabbitMQ, NATS; not Kafka, whose consumers share topics): start the dashboard with such a broker (idem dashboard --broker URL)."
	}
	return true, ""
}

// operationConfirm shows the form of an operation.
func (d *Dashboard) operationConfirm(w http.ResponseWriter, r *http.Request, action string) {
	data, _, ok := d.load(w, r)
	if !ok {
		return
	}
	data.Action = action
	data.ActionPath = fmt.Sprintf("%smessages/%s/%d/%s", d.cfg.Path, url.PathEscape(data.DB), data.M.ID, action)
	od := operationData{messageData: data}
	status := http.StatusOK
	switch action {
	case "edit":
		od.CanEdit = textshow.IsText(data.M.Body)
		if !od.CanEdit {
			od.EditWhy = fmt.Sprintf("The body is not text: edit it with the command line (idem failed edit %d --body-file FILE).", data.M.ID)
			status = http.StatusConflict
		}
		od.Body = string(data.M.Body)
		for _, k := range slices.Sorted(maps.Keys(data.M.Headers)) {
			od.Headers += k + ": " + data.M.Headers[k] + "\n"
		}
	case "redirect":
		if !od.CanRedirect {
			status = http.StatusConflict
		}
		ctx, cancel := context.WithTimeout(r.Context(), d.cfg.QueryTimeout)
		defer cancel()
		od.Consumers = d.consumerNames(ctx, data.DB, data.M.Consumer)
	}
	title := map[string]string{"edit": "Edit message %d", "redirect": "Send message %d to another consumer", "archive": "Archive message %d"}[action]
	d.render(w, status, "operation", page{Title: fmt.Sprintf(title, data.M.ID), Nav: "messages", CSRF: d.csrfToken(w, r), Data: od})
}

// consumerNames returns the consumers the database knows, but except.
func (d *Dashboard) consumerNames(ctx context.Context, db, except string) []string {
	var out []string
	for _, x := range d.cfg.Databases {
		if x.Name != db {
			continue
		}
		if snap, err := x.Source.Snapshot(ctx); err == nil {
			for _, c := range snap.Consumers {
				if c.Name != except {
					out = append(out, c.Name)
				}
			}
		}
	}
	return out
}

// parseHeaders reads the edit form's headers: one "name: value" per line,
// blank lines skipped.
func parseHeaders(s string) (map[string]string, error) {
	h := map[string]string{}
	for i, line := range strings.Split(strings.ReplaceAll(s, "\r\n", "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("headers, line %d: want \"name: value\"", i+1)
		}
		if _, dup := h[k]; dup {
			return nil, fmt.Errorf("headers, line %d: %s given twice", i+1, textshow.Printable([]byte(k)))
		}
		h[k] = strings.TrimSpace(v)
	}
	return h, nil
}

// operationAct runs a confirmed operation on data's message through store
// (acting as the request's user), once act has checked the request and
// read the message; it audits it and redirects to the message.
func (d *Dashboard) operationAct(ctx context.Context, w http.ResponseWriter, r *http.Request, action string, audit []any, data *messageData, store *inbox.FailureStore) {
	m := data.M
	back := fmt.Sprintf("%smessages/%s/%d?id=%d&notice=", d.cfg.Path, url.PathEscape(data.DB), m.ID, m.ID)
	switch action {
	case "edit":
		if !textshow.IsText(m.Body) {
			d.log.Warn("dashboard: edit", append(audit, "result", "refused: body not text")...)
			d.refuse(w, r, http.StatusConflict, fmt.Sprintf("The body is not text: edit it with the command line (idem failed edit %d --body-file FILE).", m.ID))
			return
		}
		headers, err := parseHeaders(r.PostFormValue("headers"))
		if err != nil {
			d.log.Warn("dashboard: edit", append(audit, "result", "refused: "+err.Error())...)
			d.refuse(w, r, http.StatusBadRequest, "Not edited: "+err.Error())
			return
		}
		body := []byte(strings.ReplaceAll(r.PostFormValue("body"), "\r\n", "\n"))
		detail := inbox.EditDetail(m, body, headers)
		if err := store.Edit(ctx, m.ID, body, headers); err != nil {
			d.log.Error("dashboard: edit", append(audit, "result", "error", "error", err)...)
			d.refuse(w, r, http.StatusInternalServerError, "Not edited: "+explain(err))
			return
		}
		d.log.Info("dashboard: edit", append(audit, "result", "edited", "detail", detail)...)
		http.Redirect(w, r, back+"edited", http.StatusSeeOther)
	case "archive":
		archived, err := store.Archive(ctx, m.ID)
		if err != nil {
			d.log.Error("dashboard: archive", append(audit, "result", "error", "error", err)...)
			d.refuse(w, r, http.StatusInternalServerError, "Not archived: "+explain(err))
			return
		}
		d.log.Info("dashboard: archive", append(audit, "result", map[bool]string{true: "archived", false: "already archived"}[archived])...)
		http.Redirect(w, r, back+"archived", http.StatusSeeOther)
	case "redirect":
		if ok, why := d.canRedirect(); !ok {
			d.log.Warn("dashboard: redirect", append(audit, "result", "refused: "+why)...)
			d.refuse(w, r, http.StatusConflict, why)
			return
		}
		to := strings.TrimSpace(r.PostFormValue("consumer"))
		audit = append(audit, "to", textshow.Printable([]byte(to)))
		if err := store.Redirect(ctx, d.cfg.ConsumerPublisher, m, to); err != nil {
			d.log.Error("dashboard: redirect", append(audit, "result", "error", "error", err)...)
			d.refuse(w, r, http.StatusBadGateway, "Not sent: "+explain(err))
			return
		}
		d.log.Info("dashboard: redirect", append(audit, "result", "sent and archived")...)
		http.Redirect(w, r, back+"redirected", http.StatusSeeOther)
	}
}

// shownOriginal is the message as received of an edited entry, as the
// message page shows it.
type shownOriginal struct {
	Headers [][2]string
	Body    string // as text, or a hex dump
}

// showOriginal returns what the page shows of m's message as received, nil
// when m was never edited.
func showOriginal(m idem.FailedMessage) *shownOriginal {
	if m.Original == nil {
		return nil
	}
	o := &shownOriginal{Body: hex.Dump(m.Original.Body)}
	if textshow.IsText(m.Original.Body) {
		o.Body = string(m.Original.Body)
	}
	for _, k := range slices.Sorted(maps.Keys(m.Original.Headers)) {
		o.Headers = append(o.Headers, [2]string{k, m.Original.Headers[k]})
	}
	return o
}

// operationNotice is the message shown after an operation.
func operationNotice(q url.Values) string {
	id, _ := strconv.ParseInt(q.Get("id"), 10, 64)
	switch q.Get("notice") {
	case "edited":
		return fmt.Sprintf("Message %d was edited; the message as received stays below. Retry it to send the edited message.", id)
	case "archived":
		return fmt.Sprintf("Message %d is archived: out of the lists and counts, kept here. Messages held behind it stay, to retry or remove.", id)
	case "redirected":
		return fmt.Sprintf("Message %d was sent to the other consumer, and archived.", id)
	case "archived-all":
		n, _ := strconv.Atoi(q.Get("n"))
		return fmt.Sprintf("%d message(s) were archived: out of the lists and counts, kept in the archived list. Messages held behind them stay, to retry or remove.", n)
	}
	return ""
}
