package dashboard

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/internal/textshow"
	"github.com/idem-go/idem/relay"
)

// overviewPause is an operator's pause, as the overview shows it.
type overviewPause struct {
	idem.Pause
	State string // active, scheduled
}

// pauseData is what the pause and resume pages show.
type pauseData struct {
	DB, Kind, Name string
	Action         string // pause or resume
	ActionPath     string
	Current        *idem.Pause
}

// pauseTarget reads the database, kind and name of a pause page or action.
func (d *Dashboard) pauseTarget(w http.ResponseWriter, r *http.Request) (*pauseData, inbox.Database, bool) {
	data := &pauseData{DB: r.PathValue("db"), Kind: r.PathValue("kind"), Name: r.PathValue("name"), Action: r.PathValue("action")}
	var db inbox.Database
	for _, c := range d.cfg.Databases {
		if c.Name == data.DB {
			db = c.Store
		}
	}
	switch {
	case db == nil:
		d.refuse(w, r, http.StatusNotFound, fmt.Sprintf("No database named %q.", data.DB))
		return nil, nil, false
	case data.Action != "pause" && data.Action != "resume",
		data.Kind != string(idem.PauseConsumer) && data.Kind != string(idem.PauseRelay):
		d.refuse(w, r, http.StatusNotFound, "No such page.")
		return nil, nil, false
	case d.cfg.ReadOnly:
		d.refuse(w, r, http.StatusForbidden, "The dashboard is read-only: it neither pauses nor resumes.")
		return nil, nil, false
	}
	data.ActionPath = fmt.Sprintf("%spauses/%s/%s/%s/%s", d.cfg.Path, url.PathEscape(data.DB), data.Kind, url.PathEscape(data.Name), data.Action)
	return data, db, true
}

// pauseConfirm shows the form of a pause or the confirmation of a resume.
func (d *Dashboard) pauseConfirm(w http.ResponseWriter, r *http.Request) {
	data, db, ok := d.pauseTarget(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), d.cfg.QueryTimeout)
	defer cancel()
	ps, err := db.Dialect().ListPauses(ctx, db.Pool(), idem.PauseKind(data.Kind), data.Name)
	if err != nil {
		d.refuse(w, r, http.StatusInternalServerError, explain(err))
		return
	}
	if len(ps) > 0 && !ps[0].EndedAt(time.Now()) {
		data.Current = &ps[0]
	}
	title := fmt.Sprintf("%s the %s %s", capital(data.Action), data.Kind, textshow.Printable([]byte(data.Name)))
	d.render(w, http.StatusOK, "pause", page{Title: title, Nav: "overview", CSRF: d.csrfToken(w, r), Data: data})
}

// pauseAct records a confirmed pause or resume, audits it and goes back
// to the overview.
func (d *Dashboard) pauseAct(w http.ResponseWriter, r *http.Request) {
	audit := []any{"action", r.PathValue("action"), "database", r.PathValue("db"), "kind", r.PathValue("kind"),
		"name", textshow.Printable([]byte(r.PathValue("name"))), "user", user(r), "remote", r.RemoteAddr}
	data, db, ok := d.pauseTarget(w, r)
	if !ok {
		d.log.Warn("dashboard: action refused", append(audit, "result", "refused")...)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := d.checkPost(r); err != nil {
		d.log.Warn("dashboard: action refused", append(audit, "result", "refused: "+err.Error())...)
		d.refuse(w, r, http.StatusForbidden, "Refused: "+err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), actionTimeout)
	defer cancel()
	kind := idem.PauseKind(data.Kind)
	if data.Action == "resume" {
		var resumed bool
		var err error
		if kind == idem.PauseRelay {
			resumed, err = relay.NewPauseStore(db).Resume(ctx, data.Name)
		} else {
			resumed, err = inbox.NewPauseStore(db).Resume(ctx, data.Name)
		}
		if err != nil {
			d.log.Error("dashboard: resume", append(audit, "result", "error", "error", err)...)
			d.refuse(w, r, http.StatusInternalServerError, "Not resumed: "+explain(err))
			return
		}
		d.log.Info("dashboard: resume", append(audit, "result", map[bool]string{true: "resumed", false: "was not paused"}[resumed])...)
		http.Redirect(w, r, d.cfg.Path, http.StatusSeeOther)
		return
	}
	p := idem.Pause{Reason: strings.TrimSpace(r.PostFormValue("reason")), By: user(r)}
	if p.By == "" {
		p.By = "dashboard"
	}
	if s := strings.TrimSpace(r.PostFormValue("for")); s != "" {
		dur, err := time.ParseDuration(s)
		if err != nil || dur <= 0 {
			d.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("For %q: want a positive duration (90m, 2h), or nothing for a pause until resumed.", s))
			return
		}
		p.Until = time.Now().Add(dur)
	}
	var err error
	if kind == idem.PauseRelay {
		err = relay.NewPauseStore(db).Pause(ctx, data.Name, p)
	} else {
		err = inbox.NewPauseStore(db).Pause(ctx, data.Name, p)
	}
	if err != nil {
		d.log.Error("dashboard: pause", append(audit, "result", "error", "error", err)...)
		d.refuse(w, r, http.StatusBadRequest, "Not paused: "+explain(err))
		return
	}
	d.log.Info("dashboard: pause", append(audit, "result", "paused", "until", p.Until, "reason", textshow.Printable([]byte(p.Reason)))...)
	http.Redirect(w, r, d.cfg.Path, http.StatusSeeOther)
}
