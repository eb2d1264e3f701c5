package outboxcodec

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idem-go/idem/driver"
)

// textColumns are the outbox columns DecodeText reads, in the order of
// ScanRow.
var textColumns = [...]string{"id", "aggregatetype", "aggregateid", "type", "payload", "occurred_at",
	"aggregate_version", "headers", "seq", "created_at", "attempts", "content_type", "payload_binary"}

// DecodeText reads a PostgreSQL outbox row given as the text of its columns
// (the text output of each type, as logical replication's pgoutput sends
// it) with the polling relay's rules: the same OutboxRecord, and the same
// Unreadable problems, as a claim of the same row. value returns a column's
// text, nil for NULL, and present false for a column the table does not
// have (a table with Debezium's five columns only): occurred_at and
// created_at are then zero, aggregate_version 0, headers empty, seq 0.
//
// It fails only when a column that the outbox declares with a type other
// than text holds text that type cannot have (not the case of rows the
// server decoded).
func DecodeText(value func(column string) (text []byte, present bool)) (driver.OutboxRecord, error) {
	var rec driver.OutboxRecord
	err := ScanRow(textRow{value: value}, &rec, nil)
	return rec, err
}

// textRow is one row of column texts, scanned as the dialects' queries are.
type textRow struct {
	value func(string) ([]byte, bool)
}

var textTypes = pgtype.NewMap()

// Scan implements Scanner: each destination gets its column's text, as
// the dialects' queries give it.
func (r textRow) Scan(dest ...any) error {
	if len(dest) != len(textColumns) {
		return fmt.Errorf("idem: postgres: %d destinations for %d outbox columns", len(dest), len(textColumns))
	}
	for i, d := range dest {
		col := textColumns[i]
		v, ok := r.value(col)
		if !ok {
			switch col {
			case "aggregate_version", "seq", "attempts":
				v = []byte("0")
			case "headers":
				v = []byte("{}")
			}
		}
		if err := scanText(col, v, d); err != nil {
			return err
		}
	}
	return nil
}

func scanText(col string, v []byte, d any) error {
	switch p := d.(type) {
	case *string:
		*p = string(v)
	case *[]byte:
		if v != nil && col == "payload_binary" {
			b, err := decodeBytea(v)
			if err != nil {
				return fmt.Errorf("idem: postgres: outbox column %s: %w", col, err)
			}
			*p = b
		} else if v != nil {
			*p = append([]byte(nil), v...)
		}
	case *any:
		if v == nil {
			*p = nil
		} else {
			*p = string(v)
		}
	case *int64:
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil && v != nil {
			return fmt.Errorf("idem: postgres: outbox column %s: %q is not an integer", col, v)
		}
		*p = n
	case *int:
		n, err := strconv.Atoi(string(v))
		if err != nil && v != nil {
			return fmt.Errorf("idem: postgres: outbox column %s: %q is not an integer", col, v)
		}
		*p = n
	case *time.Time:
		if v == nil {
			*p = time.Time{}
			return nil
		}
		var ts pgtype.Timestamptz
		if err := textTypes.Scan(pgtype.TimestamptzOID, pgtype.TextFormatCode, v, &ts); err != nil {
			return fmt.Errorf("idem: postgres: outbox column %s: %q: %w", col, v, err)
		}
		*p = ts.Time
	default:
		return fmt.Errorf("idem: postgres: outbox column %s: cannot scan into %T", col, d)
	}
	return nil
}

// decodeBytea decodes the text output of a bytea in the hex format
// (bytea_output = hex, PostgreSQL's default, which pgoutput sends):
// \x followed by two hex digits a byte.
func decodeBytea(v []byte) ([]byte, error) {
	if len(v) < 2 || v[0] != '\\' || v[1] != 'x' {
		return nil, fmt.Errorf("%s is not a bytea in the hex format (\\x...): set bytea_output = hex", quoteCut(v))
	}
	out := make([]byte, hex.DecodedLen(len(v)-2))
	if _, err := hex.Decode(out, v[2:]); err != nil {
		return nil, fmt.Errorf("%s is not a bytea in the hex format: %w", quoteCut(v), err)
	}
	return out, nil
}

// EncodeBytea returns b as the text output of a bytea in the hex format,
// which DecodeText reads in payload_binary.
func EncodeBytea(b []byte) []byte {
	out := make([]byte, 2+hex.EncodedLen(len(b)))
	out[0], out[1] = '\\', 'x'
	hex.Encode(out[2:], b)
	return out
}
