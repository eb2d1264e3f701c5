// Package textshow prints stored bytes for people: as they are when they
// read as text, Go-quoted otherwise, for "idem failed" and the dashboard.
package textshow

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// IsText reports whether b is valid UTF-8 without control characters other
// than newline, carriage return and tab.
func IsText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if (r < 0x20 && r != '\n' && r != '\r' && r != '\t') || r == 0x7f {
			return false
		}
	}
	return true
}

// Printable returns b as it is when it reads as text (IsText), else as a
// Go-quoted string.
func Printable(b []byte) string {
	if IsText(b) {
		return string(b)
	}
	return strconv.Quote(string(b))
}

// OneLine folds the white space of s into single spaces and cuts it to n
// runes, ending with "…" when it was longer.
func OneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
