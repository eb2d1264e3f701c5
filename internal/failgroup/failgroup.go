// Package failgroup groups failures by cause: the class of the failure and
// its error text with the variable parts (ids, numbers, quoted values, hex,
// times) normalized away, so that "event 0193… field "qty" is -3" and
// "event 0194… field "qty" is -7" are one cause. The consumers' failure
// store (inbox.FailureStore.Groups) and the relay's quarantine ("idem failed
// groups --relay") both use it.
package failgroup

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Placeholders of the normalized text.
const (
	phUUID   = "<uuid>"
	phTime   = "<time>"
	phHex    = "<hex>"
	phNumber = "<n>"
	phQuoted = "<q>"
	phDur    = "<dur>"
)

// maxInput bounds the error text normalized: the cause is in its start, and
// an error that carries a whole response body would otherwise make every
// failure a group of its own.
const maxInput = 1000

// maxQuoted bounds a quoted value: a quote that does not close within it is
// text.
const maxQuoted = 300

var (
	reUUID  = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)
	reTime  = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2}| ?UTC)?)?`)
	reClock = regexp.MustCompile(`^\d{2}:\d{2}:\d{2}(?:[.,]\d+)?`)
	reHex0x = regexp.MustCompile(`^0[xX][0-9a-fA-F]+`)
	reHex   = regexp.MustCompile(`^[0-9a-fA-F]{8,}`)
	reDur   = regexp.MustCompile(`^(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+`)
	reNum   = regexp.MustCompile(`^-?\d+(?:[.,]\d+)*`)
)

// Normalize returns the error text err with its variable parts replaced by
// placeholders: UUIDs <uuid>, times and dates <time>, durations <dur>, hex
// numbers (0x… or 8 hex digits and more, one a digit at least) <hex>,
// numbers <n>, quoted values ("…", '…') <q>. Digits inside a word (v1,
// o12) are left alone. Runs of white space become one space.
func Normalize(err string) string {
	if len(err) > maxInput {
		err = err[:maxInput]
	}
	var b strings.Builder
	b.Grow(len(err))
	space := false
	for i := 0; i < len(err); {
		c := err[i]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			space = true
			i++
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		boundary := i == 0 || !isWord(err[i-1])
		switch {
		case c == '"':
			if n := quoted(err[i:], '"'); n > 0 {
				b.WriteString(phQuoted)
				i += n
				continue
			}
		case c == '\'' && boundary:
			if n := quoted(err[i:], '\''); n > 0 {
				b.WriteString(phQuoted)
				i += n
				continue
			}
		case boundary && (isDigit(c) || isHexLetter(c) || c == '-' && i+1 < len(err) && isDigit(err[i+1])):
			if ph, n := variable(err[i:]); n > 0 {
				b.WriteString(ph)
				i += n
				continue
			}
		}
		if !isWord(c) {
			b.WriteByte(c)
			i++
			continue
		}
		// A word that is not a value: copied whole, so that the
		// digits inside it stay.
		j := i
		for j < len(err) && isWord(err[j]) {
			j++
		}
		b.WriteString(err[i:j])
		i = j
	}
	return b.String()
}

// variable returns the placeholder of the value s starts with and its
// length, or 0 when s starts with no value (a value must end at a word's
// end).
func variable(s string) (string, int) {
	for _, v := range []struct {
		re *regexp.Regexp
		ph string
		ok func(string) bool
	}{
		{reUUID, phUUID, nil},
		{reTime, phTime, nil},
		{reClock, phTime, nil},
		{reHex0x, phHex, nil},
		{reHex, phHex, func(m string) bool { return strings.ContainsAny(m, "0123456789") }},
		{reDur, phDur, nil},
		{reNum, phNumber, nil},
	} {
		m := v.re.FindString(s)
		if m == "" || len(m) < len(s) && isWord(s[len(m)]) || v.ok != nil && !v.ok(m) {
			continue
		}
		return v.ph, len(m)
	}
	return "", 0
}

// quoted returns the length of the quoted value s starts with (q, then up
// to maxQuoted bytes, then q; a backslash escapes the next byte), or 0. A
// single quote must close before a word's end: "can't" is no quote.
func quoted(s string, q byte) int {
	for j := 1; j < len(s) && j <= maxQuoted; j++ {
		switch s[j] {
		case '\\':
			if q == '"' {
				j++
			}
		case '\n':
			return 0
		case q:
			if q == '\'' && j+1 < len(s) && isWord(s[j+1]) {
				continue
			}
			return j + 1
		}
	}
	return 0
}

func isDigit(c byte) bool     { return '0' <= c && c <= '9' }
func isHexLetter(c byte) bool { return 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
func isWord(c byte) bool {
	return isDigit(c) || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_'
}

// ID returns the stable id of the group of scope (a consumer name; "relay"
// for the relay's quarantine), class and normalized cause: 12 hex digits of
// their SHA-256.
func ID(scope, class, cause string) string {
	h := sha256.Sum256([]byte(scope + "\x00" + class + "\x00" + cause))
	return hex.EncodeToString(h[:6])
}

// IDLen is the length of an id.
const IDLen = 12

// ValidID reports whether s can be a group id.
func ValidID(s string) bool {
	if len(s) != IDLen {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil && strings.ToLower(s) == s
}

// Group is one group of failures.
type Group struct {
	// ID is the group's id (see ID).
	ID string `json:"id"`
	// Scope is the consumer name, or "relay" for the relay's quarantine.
	Scope string `json:"consumer"`
	// Class says what kind of failure it is.
	Class string `json:"class"`
	// Cause is the normalized error text.
	Cause string `json:"cause"`
	// Example is the error text of the group's most recent failure, as
	// stored; of failures at the same instant, the first counted (the
	// newest when counted as the failure store lists them, newest first).
	Example string `json:"example"`
	// Count is the number of failures.
	Count int `json:"count"`
	// FirstSeen and LastSeen are the earliest and latest failure times.
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
}

// Counter adds failures up into groups. Its memory grows with the number
// of groups, not of failures: read the failures in pages and Add each.
type Counter struct {
	groups map[string]*Group
	order  []string
}

// Add counts one failure and returns its group's id: its cause is errText
// normalized.
func (c *Counter) Add(scope, class, errText string, first, last time.Time) string {
	return c.AddCause(scope, class, Normalize(errText), errText, first, last)
}

// AddCause counts one failure whose normalized cause is cause and whose
// error, as stored, is errText, and returns its group's id.
func (c *Counter) AddCause(scope, class, cause, errText string, first, last time.Time) string {
	id := ID(scope, class, cause)
	if c.groups == nil {
		c.groups = map[string]*Group{}
	}
	g, ok := c.groups[id]
	if !ok {
		g = &Group{ID: id, Scope: scope, Class: class, Cause: cause, FirstSeen: first, LastSeen: last}
		c.groups[id] = g
		c.order = append(c.order, id)
	}
	g.Count++
	if first.Before(g.FirstSeen) {
		g.FirstSeen = first
	}
	// On a tie (failures in the same instant, as SQLite's milliseconds
	// make likely), the first counted keeps it: the newest, read first.
	if !ok || last.After(g.LastSeen) {
		g.LastSeen = last
		g.Example = errText
		if len(g.Example) > maxInput {
			g.Example = g.Example[:maxInput]
		}
	}
	return id
}

// Len returns the number of groups.
func (c *Counter) Len() int { return len(c.order) }

// Groups returns the groups, largest first, then by scope, class and cause.
func (c *Counter) Groups() []Group {
	out := make([]Group, 0, len(c.order))
	for _, id := range c.order {
		out = append(out, *c.groups[id])
	}
	sortGroups(out)
	return out
}

func sortGroups(gs []Group) {
	less := func(a, b Group) int {
		switch {
		case a.Count != b.Count:
			return b.Count - a.Count
		case a.Scope != b.Scope:
			return strings.Compare(a.Scope, b.Scope)
		case a.Class != b.Class:
			return strings.Compare(a.Class, b.Class)
		}
		return strings.Compare(a.Cause, b.Cause)
	}
	slices.SortFunc(gs, less)
}

// Classes of failures.
const (
	// ClassUndecodable: a consumer could not decode the message.
	ClassUndecodable = "undecodable"
	// ClassPermanent: a handler returned idem.Permanent.
	ClassPermanent = "permanent"
	// ClassExhausted: a handler failed on every attempt the retry policy
	// allows.
	ClassExhausted = "exhausted"
	// ClassHeld: the message waits behind a parked message of its
	// aggregate.
	ClassHeld = "held"
	// ClassUnreadable: the relay cannot turn the outbox row into a
	// message.
	ClassUnreadable = "unreadable"
	// ClassRefused: the broker refused the row's message on every
	// attempt.
	ClassRefused = "refused"
	// ClassOther: a quarantined row whose error says neither.
	ClassOther = "other"
)

// The error texts the classes are read from: the failure store keeps the
// error's text only. They are idem's own (idem.DecodeError,
// idem.Permanent, the relay's quarantine).
const (
	undecodableText = "idem: undecodable message"
	permanentText   = "permanent: "
	refusedText     = "refused by the broker"
	unreadableText  = "cannot be published"
)

// ConsumerClass returns the class of a consumer's parked message whose
// error text is errText, held behind the parked message heldBy (0: parked
// for its own failure).
func ConsumerClass(errText string, heldBy int64) string {
	switch {
	case heldBy != 0:
		return ClassHeld
	case strings.Contains(errText, undecodableText):
		return ClassUndecodable
	case strings.Contains(errText, permanentText):
		return ClassPermanent
	}
	return ClassExhausted
}

// HeldCause returns the cause of a message of class ClassHeld whose error
// is errText and whose aggregate id is aggregateID: errText normalized,
// with the aggregate id replaced by <id> first, so that the messages held
// behind parked messages of every aggregate of a type are one group,
// whatever their ids look like.
func HeldCause(errText, aggregateID string) string {
	if aggregateID != "" {
		errText = strings.Replace(errText, " "+aggregateID+heldTextAfterID, " "+phID+heldTextAfterID, 1)
	}
	return Normalize(errText)
}

// heldTextAfterID follows the aggregate id in the error of a held message
// (inbox's "idem: held behind parked message N of aggregate TYPE ID,
// which is retried or removed first").
const heldTextAfterID = ", which is retried"

// phID stands for an aggregate id.
const phID = "<id>"

// RelayClass returns the class of a quarantined outbox row whose
// last_error is lastError. It reads the error only, not the row, so that a
// row repaired since stays in its group.
func RelayClass(lastError string) string {
	switch {
	case strings.HasPrefix(lastError, refusedText):
		return ClassRefused
	case strings.Contains(lastError, unreadableText):
		return ClassUnreadable
	}
	return ClassOther
}

// RelayScope is the scope of the relay's quarantine groups.
const RelayScope = "relay"
