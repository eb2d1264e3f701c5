// Package sqltime reads and writes the timestamps of the MySQL and SQLite
// dialects: UTC wall-clock values with microseconds, in columns that carry no
// time zone (DATETIME(6) in MySQL, TEXT in SQLite).
package sqltime

import (
	"fmt"
	"time"
)

// Layout is how timestamps are written: UTC, six fractional digits. Text in
// this layout sorts like the times it holds, also next to SQLite's
// strftime('%Y-%m-%d %H:%M:%f') with three digits.
const Layout = "2006-01-02 15:04:05.000000"

// Format returns t in UTC in Layout.
func Format(t time.Time) string { return t.UTC().Format(Layout) }

// Arg returns Format(t), or nil for the zero time.
func Arg(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return Format(t)
}

var layouts = []string{
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999 -0700 MST",
}

// Parse reads a timestamp written by Format, by the database's own clock
// functions, or by a driver.
func Parse(s string) (time.Time, error) {
	for _, l := range layouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("idem: cannot read %q as a timestamp", s)
}

// Scanner returns a sql.Scanner that stores a timestamp column into t. A
// time.Time from the driver is taken by its wall clock, as UTC, whatever the
// location the driver attached to it (the column holds UTC). NULL stores the
// zero time.
func Scanner(t *time.Time) interface{ Scan(any) error } { return scanner{t} }

type scanner struct{ t *time.Time }

func (s scanner) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*s.t = time.Time{}
	case time.Time:
		*s.t = time.Date(v.Year(), v.Month(), v.Day(), v.Hour(), v.Minute(), v.Second(), v.Nanosecond(), time.UTC)
	case []byte:
		t, err := Parse(string(v))
		if err != nil {
			return err
		}
		*s.t = t
	case string:
		t, err := Parse(v)
		if err != nil {
			return err
		}
		*s.t = t
	default:
		return fmt.Errorf("idem: cannot read %T as a timestamp", src)
	}
	return nil
}
