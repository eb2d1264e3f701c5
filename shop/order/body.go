package order

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The body of POST /orders is read in two passes. checkBody walks its
// tokens (encoding/json's Decoder.Token) against the shape of a
// PlaceRequest; then json.Unmarshal fills the struct. The walk refuses what
// Unmarshal would take silently, and says in the client's terms what
// Unmarshal would say in Go's:
//
//   - a member sent twice, at any depth: Unmarshal keeps the last copy, so
//     two bodies that differ only in which copy comes last would be the same
//     order with different fingerprints for the Idempotency-Key. Names
//     compare after unescaping ("customer\u005fid" is customer_id);
//   - a member the order does not have, or a known one spelt in another
//     case ("Customer_ID"), which Unmarshal matches without regard to case;
//   - a value of the wrong type, with its path ("lines[0].quantity") and
//     what is expected;
//   - anything but whitespace after the order.

// jsonKind is the kind of a JSON value.
type jsonKind int

const (
	jsonString jsonKind = iota
	jsonObject
	jsonArray
	jsonOther // a number, true, false or null
)

// shape is what a value of the request must be.
type shape struct {
	kind jsonKind
	// expect says what the value must be, for messages: `a string such as "c-7"`.
	expect string
	// members are an object's members, by exact name, in the order
	// messages list them; noun names the object in messages ("an order").
	members []member
	noun    string
	// elem is the shape of an array's elements.
	elem *shape
}

type member struct {
	name  string
	shape *shape
}

const (
	exampleLine  = `{"product_id":"p-1","quantity":"2.000"}`
	exampleOrder = `{"customer_id":"c-7","lines":[` + exampleLine + `]}`
)

// orderShape is the shape of a PlaceRequest.
var orderShape = &shape{
	kind: jsonObject, expect: "a JSON object such as " + exampleOrder, noun: "an order",
	members: []member{
		{"customer_id", &shape{kind: jsonString, expect: `a string such as "c-7"`}},
		{"lines", &shape{kind: jsonArray, expect: "an array of lines such as [" + exampleLine + "]",
			elem: &shape{kind: jsonObject, expect: "an object such as " + exampleLine, noun: "a line",
				members: []member{
					{"product_id", &shape{kind: jsonString, expect: `a string such as "p-1"`}},
					{"quantity", &shape{kind: jsonString, expect: `a string such as "2.000"`}},
				}}}},
	},
}

// member returns the shape of the member named name, or nil.
func (s *shape) member(name string) *shape {
	for _, m := range s.members {
		if m.name == name {
			return m.shape
		}
	}
	return nil
}

// names lists the members of an object shape for messages: "customer_id
// and lines".
func (s *shape) names() string {
	n := make([]string, len(s.members))
	for i, m := range s.members {
		n[i] = m.name
	}
	if len(n) < 2 {
		return strings.Join(n, "")
	}
	return strings.Join(n[:len(n)-1], ", ") + " and " + n[len(n)-1]
}

// checkBody walks body, which is not empty, against the shape of a
// PlaceRequest, and returns the first problem it meets as a message for the
// client, or nil when json.Unmarshal can fill a PlaceRequest from body with
// every member taken once and by its exact name.
func checkBody(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // a number is a token, whatever its size
	if err := walk(dec, orderShape, ""); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("the body has data after the JSON order; send one JSON object")
	}
	return nil
}

// walk reads one value from dec and checks it against sh; path is where
// the value is in the body ("lines[1].quantity"), "" for the body itself.
func walk(dec *json.Decoder, sh *shape, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return syntaxProblem(err)
	}
	if kindOf(tok) != sh.kind {
		return fmt.Errorf("%s must be %s, not %s", where(path), sh.expect, describe(tok))
	}
	switch sh.kind {
	case jsonObject:
		seen := make(map[string]bool, len(sh.members))
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return syntaxProblem(err)
			}
			name, ok := tok.(string)
			if !ok { // Token returns each member's name as a string
				return errors.New("the body is not valid JSON")
			}
			m := sh.member(name)
			if m == nil {
				return unknownMember(sh, path, name)
			}
			p := name
			if path != "" {
				p = path + "." + name
			}
			if seen[name] {
				return fmt.Errorf("%s appears twice; send each member once", p)
			}
			seen[name] = true
			if err := walk(dec, m, p); err != nil {
				return err
			}
		}
	case jsonArray:
		for i := 0; dec.More(); i++ {
			if err := walk(dec, sh.elem, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	default:
		return nil
	}
	if _, err := dec.Token(); err != nil { // the closing '}' or ']'
		return syntaxProblem(err)
	}
	return nil
}

// unknownMember says that the object of shape sh at path has no member
// name.
func unknownMember(sh *shape, path, name string) error {
	const longest = 40
	shown := name
	if len(shown) > longest {
		shown = strings.ToValidUTF8(shown[:longest], "") + "..."
	}
	in := ""
	if path != "" {
		in = " in " + path
	}
	hint := ""
	for _, m := range sh.members {
		if strings.EqualFold(m.name, name) {
			hint = fmt.Sprintf(" (member names are case-sensitive: %s)", m.name)
		}
	}
	return fmt.Errorf("unknown member %s%s: %s has only %s%s", strconv.Quote(shown), in, sh.noun, sh.names(), hint)
}

// syntaxProblem describes an error of Decoder.Token.
func syntaxProblem(err error) error {
	var syntax *json.SyntaxError
	switch {
	case errors.As(err, &syntax):
		return fmt.Errorf("the body is not valid JSON: %s (at byte %d)", syntax.Error(), syntax.Offset)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("the body ends before the end of the JSON order")
	default:
		return errors.New("the body is not valid JSON")
	}
}

func kindOf(tok json.Token) jsonKind {
	switch tok {
	case json.Delim('{'):
		return jsonObject
	case json.Delim('['):
		return jsonArray
	}
	if _, ok := tok.(string); ok {
		return jsonString
	}
	return jsonOther
}

// describe names the value that tok starts: "a number", "an object".
func describe(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			return "an object"
		}
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return strconv.FormatBool(t)
	default:
		return "null"
	}
}

// where names the value at path in messages.
func where(path string) string {
	if path == "" {
		return "the body"
	}
	return path
}
