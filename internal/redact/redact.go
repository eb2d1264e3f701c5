// Package redact removes secrets from what idem prints: the one
// redaction of the commands' logs, errors, status pages and panics
// (broker.RedactURL is its public name).
//
// String replaces, anywhere in a text:
//
//   - the password of a URL's user information
//     (postgres://app:PASSWORD@db/shop), and the whole user information of a
//     NATS URL without a password, which nats.go sends as a token
//     (nats://TOKEN@host);
//   - the password of a MySQL DSN (app:PASSWORD@tcp(db:3306)/shop);
//   - the value of every key whose name ends in "password" or "secret" in
//     a query string or a PostgreSQL keyword/value connection string
//     (password=, sslpassword=, Kafka's sasl_password=, a webhook's
//     secret= or client_secret=, which idem refuses but a user may write),
//     quoted or not;
//
// with Mask. Error texts that quote a URL (url.Parse's do, whole) come out
// without the password, wherever the URL sits in them.
package redact

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
)

// Mask replaces each secret.
const Mask = "xxxxx"

var (
	// userinfo finds scheme://USERINFO@: the user information ends at its
	// last "@" before the path, query or fragment (as url.Parse and pgx
	// read it, so an unescaped "@" in a password is covered).
	userinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*)://([^/?#\s"'` + "`" + `]*)@`)
	// dsn finds a MySQL DSN's user:password@ before its protocol.
	dsn = regexp.MustCompile(`([A-Za-z0-9_.$-]+):([^\s"'` + "`" + `]*?)@(tcp[46]?|unix)?\(`)
	// keyValue finds a key ending in "password" or "secret" and its value: quoted
	// (PostgreSQL keyword/value strings: 'it''s', 'a\'b'), or up to the
	// next separator of a query string or a keyword/value string.
	keyValue = regexp.MustCompile(`(?i)([A-Za-z0-9_]*(?:password|secret)\s*=\s*)('(?:[^'\\]|\\.|'')*'|[^&\s;#"'` + "`" + `]*)`)
)

// String returns s with every secret it recognises replaced by Mask. A
// text without one comes back unchanged.
func String(s string) string {
	if !strings.Contains(s, "@") && !strings.Contains(s, "assword") && !strings.Contains(s, "ASSWORD") &&
		!strings.Contains(s, "ecret") && !strings.Contains(s, "ECRET") {
		return s
	}
	s = userinfo.ReplaceAllStringFunc(s, func(m string) string {
		sub := userinfo.FindStringSubmatch(m)
		scheme, info := sub[1], sub[2]
		user, _, hasPass := strings.Cut(info, ":")
		switch {
		case hasPass:
			return scheme + "://" + user + ":" + Mask + "@"
		case isNATS(scheme) && info != "":
			return scheme + "://" + Mask + "@"
		}
		return m
	})
	s = dsn.ReplaceAllStringFunc(s, func(m string) string {
		sub := dsn.FindStringSubmatch(m)
		return sub[1] + ":" + Mask + "@" + sub[3] + "("
	})
	return keyValue.ReplaceAllString(s, "${1}"+Mask)
}

// isNATS reports whether scheme is a NATS URL's, whose user information
// without a password is a token.
func isNATS(scheme string) bool {
	return strings.EqualFold(scheme, "nats") || strings.EqualFold(scheme, "tls")
}

// Error returns err with its text redacted (String), wrapping it so that
// errors.Is and errors.As still find what it wraps; nil for nil.
func Error(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*redacted); ok {
		return err
	}
	return &redacted{err: err}
}

type redacted struct{ err error }

func (e *redacted) Error() string { return String(e.err.Error()) }
func (e *redacted) Unwrap() error { return e.err }

// Handler returns a slog.Handler that redacts (String) the message and
// every string, error and Stringer attribute before passing the record to
// h: whatever a library logs through it leaves without a password.
func Handler(h slog.Handler) slog.Handler { return handler{h} }

type handler struct{ h slog.Handler }

func (r handler) Enabled(ctx context.Context, l slog.Level) bool { return r.h.Enabled(ctx, l) }

func (r handler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, String(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(attr(a))
		return true
	})
	return r.h.Handle(ctx, out)
}

func (r handler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = attr(a)
	}
	return handler{r.h.WithAttrs(red)}
}

func (r handler) WithGroup(name string) slog.Handler { return handler{r.h.WithGroup(name)} }

// attr returns a with its value redacted.
func attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, String(v.String()))
	case slog.KindGroup:
		as := v.Group()
		red := make([]slog.Attr, len(as))
		for i, g := range as {
			red[i] = attr(g)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(red...)}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, String(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, String(x.String()))
		}
		// Other values keep their kind (the JSON handler marshals them)
		// unless their text holds a secret.
		if text := fmt.Sprint(v.Any()); String(text) != text {
			return slog.String(a.Key, String(text))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}

// ExitOnPanic, deferred first thing in a command's main, prints a panic of
// main's goroutine on stderr as "NAME: panic: VALUE" and its stack, both
// redacted (a panic's value may quote a URL), and exits with status 2, as
// the runtime does. Call it only deferred.
func ExitOnPanic(name string) {
	v := recover()
	if v == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "%s: panic: %s\n\n%s", name, String(fmt.Sprint(v)), String(string(debug.Stack())))
	os.Exit(2)
}
