package idem_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/idem-go/idem"
)

// The derived ids are written out: a change of the namespace, of the hash
// or of the bytes hashed changes the ids consumers have recorded, and fails
// here.
func TestEventIDGolden(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", idem.EventIDMaxBytes)
	for _, c := range []struct{ raw, want string }{
		{"E42", "3f240152-ed00-547c-b98c-d4d274c69d5e"},
		{long, "bb6d9666-3ef6-590e-9632-1774ea480355"},
	} {
		got, err := idem.EventID(c.raw)
		if err != nil || got.String() != c.want {
			t.Errorf("EventID(%q) = %v, %v; want %s", c.raw, got, err, c.want)
		}
		if got.Version() != 5 || got.Variant() != uuid.RFC4122 {
			t.Errorf("EventID(%q) = %v: version %d, variant %v; want a version 5 UUID", c.raw, got, got.Version(), got.Variant())
		}
		if !idem.IsDerivedEventID(c.raw) {
			t.Errorf("IsDerivedEventID(%q) = false", c.raw)
		}
	}
}

// The namespace is what its comment says: the version 5 UUID of idem's URL.
func TestEventIDNamespace(t *testing.T) {
	t.Parallel()
	want := uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://github.com/idem-go/idem#event-id"))
	if idem.EventIDNamespace != want.String() {
		t.Fatalf("EventIDNamespace = %s, want %s", idem.EventIDNamespace, want)
	}
	got, _ := idem.EventID("E42")
	if want := uuid.NewSHA1(uuid.MustParse(idem.EventIDNamespace), []byte("E42")); got != want {
		t.Fatalf("EventID(E42) = %s, want uuid.NewSHA1(EventIDNamespace, \"E42\") = %s", got, want)
	}
}

// What uuid.Parse reads stays the UUID it spells, as the relays published
// it before the rule: no derived id, no header.
func TestEventIDUUIDSpellings(t *testing.T) {
	t.Parallel()
	u := uuid.MustParse("0193a0e4-5b7c-7d7e-8f90-a1b2c3d4e5f6")
	for _, raw := range []string{
		u.String(),
		strings.ToUpper(u.String()),
		"{" + u.String() + "}",
		"urn:uuid:" + u.String(),
		strings.ReplaceAll(u.String(), "-", ""),
	} {
		got, err := idem.EventID(raw)
		if err != nil || got != u {
			t.Errorf("EventID(%q) = %v, %v; want %v", raw, got, err, u)
		}
		if idem.IsDerivedEventID(raw) {
			t.Errorf("IsDerivedEventID(%q) = true, want false", raw)
		}
	}
	// Almost a UUID is text: its bytes give the id.
	for _, raw := range []string{u.String()[:35], u.String() + "0", strings.ReplaceAll(u.String(), "-", "_"), " " + u.String()} {
		got, err := idem.EventID(raw)
		if err != nil || got == u || got != uuid.NewSHA1(uuid.MustParse(idem.EventIDNamespace), []byte(raw)) {
			t.Errorf("EventID(%q) = %v, %v; want the derived id", raw, got, err)
		}
	}
}

// Each byte counts: case, spaces and Unicode normal forms give other ids.
func TestEventIDExactBytes(t *testing.T) {
	t.Parallel()
	seen := map[uuid.UUID]string{}
	for _, raw := range []string{"E42", "e42", "E42 ", " E42", "caf\u00e9", "cafe\u0301", "\u00c9v\u00e9nement-42", "a"} {
		id, err := idem.EventID(raw)
		if err != nil {
			t.Fatalf("EventID(%q): %v", raw, err)
		}
		if other, ok := seen[id]; ok {
			t.Errorf("EventID(%q) = EventID(%q) = %v", raw, other, id)
		}
		seen[id] = raw
		if again, _ := idem.EventID(raw); again != id {
			t.Errorf("EventID(%q) gave %v, then %v", raw, id, again)
		}
	}
}

func TestEventIDRefused(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ raw, problem string }{
		{"", "is empty"},
		{strings.Repeat("x", idem.EventIDMaxBytes+1), "is 65 bytes long, more than 64"},
		{strings.Repeat("\u00e9", 33), "is 66 bytes long, more than 64"}, // 33 characters, 66 bytes
		{"E\xff42", "is not valid UTF-8"},
		{"E42\n", "holds the control character 0x0a"},
		{"E\x0042", "holds the control character 0x00"},
		{"E\x7f", "holds the control character 0x7f"},
		{uuid.Nil.String(), "is the nil UUID"},
	} {
		id, err := idem.EventID(c.raw)
		var ie *idem.EventIDError
		if !errors.As(err, &ie) || id != uuid.Nil {
			t.Errorf("EventID(%q) = %v, %v; want an *EventIDError", c.raw, id, err)
			continue
		}
		if ie.ID != c.raw || !strings.HasPrefix(ie.Problem, c.problem) {
			t.Errorf("EventID(%q): %+v, want the problem %q", c.raw, ie, c.problem)
		}
		if !strings.HasPrefix(err.Error(), "idem: event id: ") {
			t.Errorf("EventID(%q): %q does not start with \"idem: event id: \"", c.raw, err)
		}
		if idem.IsDerivedEventID(c.raw) {
			t.Errorf("IsDerivedEventID(%q) = true", c.raw)
		}
	}
	// 64 bytes of two-byte characters are accepted.
	if _, err := idem.EventID(strings.Repeat("\u00e9", 32)); err != nil {
		t.Errorf("64 bytes of é: %v", err)
	}
}

func FuzzEventID(f *testing.F) {
	for _, s := range []string{"E42", "", uuid.NewString(), "{" + uuid.NewString() + "}", strings.Repeat("x", 65), "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		id, err := idem.EventID(raw)
		if err != nil {
			if id != uuid.Nil || idem.IsDerivedEventID(raw) {
				t.Fatalf("EventID(%q) = %v with error %v", raw, id, err)
			}
			return
		}
		if id == uuid.Nil {
			t.Fatalf("EventID(%q) = the nil UUID", raw)
		}
		if idem.IsDerivedEventID(raw) {
			if _, perr := uuid.Parse(raw); perr == nil || len(raw) > idem.EventIDMaxBytes || id.Version() != 5 {
				t.Fatalf("EventID(%q) = %v derived, but uuid.Parse reads it, or too long", raw, id)
			}
		} else if u, perr := uuid.Parse(raw); perr != nil || u != id {
			t.Fatalf("EventID(%q) = %v not derived, but uuid.Parse gives %v, %v", raw, id, u, perr)
		}
	})
}

// A program that writes the outbox with ids of its own computes the event
// id that consumers will see, and record in processed_event.
func ExampleEventID() {
	for _, raw := range []string{
		"E42",                                  // not a UUID: derived, sent with header idem-original-id: E42
		"0193a0e4-5b7c-7d7e-8f90-a1b2c3d4e5f6", // a UUID: itself
		strings.Repeat("x", 65),                // too long: quarantined by the relays
	} {
		id, err := idem.EventID(raw)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(id, idem.IsDerivedEventID(raw))
	}
	// Output:
	// 3f240152-ed00-547c-b98c-d4d274c69d5e true
	// 0193a0e4-5b7c-7d7e-8f90-a1b2c3d4e5f6 false
	// idem: event id: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" is 65 bytes long, more than 64: an event id is a UUID, or 1 to 64 bytes of UTF-8 text without control characters
}
