package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-go/idem/internal/mysqlrepl"
)

// ErrColumnsChanged is wrapped by the error of a relay that reads outbox
// rows logged under other columns than the table has now, without column
// names in the binlog (binlog_row_metadata NO_LOG or MINIMAL): an ALTER
// TABLE came after those rows, and the relay had not read them when it
// read the table's columns (it was stopped, or behind). It cannot tell
// which value is which column, and publishes nothing under a wrong name.
// On an outbox with idem's columns and Config.Delete = DeletePublished the
// relay recovers by itself: it publishes the rows waiting in the table, as
// at a first start, and reads the binlog on from that snapshot. Otherwise
// it stops there until an operator publishes the waiting rows another way
// (idem relay) and forgets the position (ResetPosition).
var ErrColumnsChanged = errors.New("idem: binlog: the outbox's columns changed")

// Where the relay reads the outbox's column names (Relay.names).
const (
	namesUnknown int32 = iota
	namesFromBinlog
	namesFromSchema
)

// schemaColumn is a column of the outbox as information_schema describes
// it.
type schemaColumn struct {
	name, dataType     string // DATA_TYPE lower-cased
	nullable, unsigned bool
	// octets is CHARACTER_OCTET_LENGTH; precision and scale,
	// NUMERIC_PRECISION and NUMERIC_SCALE; fsp, DATETIME_PRECISION.
	octets, precision, scale, fsp sql.NullInt64
}

// readColumns reads the outbox's columns from information_schema, in the
// table's order (the binlog's).
func (r *source) readColumns(ctx context.Context) ([]schemaColumn, error) {
	rows, err := r.db.QueryContext(ctx, `SELECT COLUMN_NAME, LOWER(DATA_TYPE), IS_NULLABLE = 'YES', COLUMN_TYPE LIKE '%unsigned%',
    CHARACTER_OCTET_LENGTH, NUMERIC_PRECISION, NUMERIC_SCALE, DATETIME_PRECISION
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, r.schema, r.cfg.Tables.Outbox)
	if err != nil {
		return nil, fmt.Errorf("idem: binlog: read the outbox's columns: %w", err)
	}
	defer rows.Close()
	var cols []schemaColumn
	for rows.Next() {
		var c schemaColumn
		if err := rows.Scan(&c.name, &c.dataType, &c.nullable, &c.unsigned, &c.octets, &c.precision, &c.scale, &c.fsp); err != nil {
			return nil, fmt.Errorf("idem: binlog: read the outbox's columns: %w", err)
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idem: binlog: read the outbox's columns: %w", err)
	}
	return cols, nil
}

// columnsDiffer returns "" when the columns of a table map can be the
// table's, in order (their number, nullability and types, with lengths,
// precisions and fractional seconds where the table map has them), or what
// differs. Names are not compared: this is for table maps without them.
// A type it does not know fits any binlog type.
func columnsDiffer(table []schemaColumn, mapped []mysqlrepl.Column) string {
	if len(table) != len(mapped) {
		return fmt.Sprintf("the rows in the binlog have %d columns, the table %d", len(mapped), len(table))
	}
	for i, c := range table {
		m := mapped[i]
		if m.Nullable != c.nullable || !typeFits(c, m) {
			null := "NOT NULL"
			if c.nullable {
				null = "NULL"
			}
			return fmt.Sprintf("the binlog's column %d is not the table's %s (%s %s)", i+1, c.name, c.dataType, null)
		}
	}
	return ""
}

// fixedTypes are the data types whose binlog type alone tells them.
var fixedTypes = map[string]byte{
	"tinyint": mysqlrepl.TypeTiny, "smallint": mysqlrepl.TypeShort, "mediumint": mysqlrepl.TypeInt24,
	"int": mysqlrepl.TypeLong, "bigint": mysqlrepl.TypeLongLong, "float": mysqlrepl.TypeFloat,
	"double": mysqlrepl.TypeDouble, "year": mysqlrepl.TypeYear, "enum": mysqlrepl.TypeEnum,
	"set": mysqlrepl.TypeSet, "bit": mysqlrepl.TypeBit, "geometry": mysqlrepl.TypeGeometry,
	"point": mysqlrepl.TypeGeometry, "linestring": mysqlrepl.TypeGeometry, "polygon": mysqlrepl.TypeGeometry,
	"multipoint": mysqlrepl.TypeGeometry, "multilinestring": mysqlrepl.TypeGeometry,
	"multipolygon": mysqlrepl.TypeGeometry, "geometrycollection": mysqlrepl.TypeGeometry,
}

// blobLengthBytes are the sizes of the length of the TEXT and BLOB types
// (MariaDB's JSON is a LONGTEXT; MySQL's is TypeJSON): their metadata in a
// table map.
var blobLengthBytes = map[string]uint16{
	"tinytext": 1, "tinyblob": 1, "text": 2, "blob": 2, "mediumtext": 3, "mediumblob": 3,
	"longtext": 4, "longblob": 4, "json": 4,
}

// typeFits reports whether a table map's column can be the table's column
// c. A type it does not know (UUID, INET6...) fits any.
func typeFits(c schemaColumn, m mysqlrepl.Column) bool {
	t := m.RealType()
	if want, ok := fixedTypes[c.dataType]; ok {
		return t == want
	}
	if c.dataType == "json" && t == mysqlrepl.TypeJSON {
		return true // MySQL's binary JSON
	}
	if n, ok := blobLengthBytes[c.dataType]; ok {
		return t == mysqlrepl.TypeBlob && m.Meta == n || t == mysqlrepl.TypeBlobCompressed
	}
	meta := func(v sql.NullInt64) bool { return v.Valid && int64(m.Meta) == v.Int64 }
	switch c.dataType {
	case "decimal":
		return t == mysqlrepl.TypeNewDecimal && c.precision.Valid && c.scale.Valid &&
			int64(m.Meta) == c.precision.Int64<<8|c.scale.Int64
	case "date":
		return t == mysqlrepl.TypeDate || t == mysqlrepl.TypeNewDate
	// The pre-10.1 temporal types have no fractional seconds in the table
	// map (and mysqlrepl refuses their values).
	case "time":
		return t == mysqlrepl.TypeTime2 && meta(c.fsp) || t == mysqlrepl.TypeTime
	case "datetime":
		return t == mysqlrepl.TypeDateTime2 && meta(c.fsp) || t == mysqlrepl.TypeDateTime
	case "timestamp":
		return t == mysqlrepl.TypeTimestamp2 && meta(c.fsp) || t == mysqlrepl.TypeTimestamp
	case "char", "binary":
		return t == mysqlrepl.TypeString && c.octets.Valid && int64(m.FixedLength()) == c.octets.Int64
	case "varchar", "varbinary":
		return (t == mysqlrepl.TypeVarchar || t == mysqlrepl.TypeVarString) && meta(c.octets) || t == mysqlrepl.TypeVarcharCompressed
	}
	return true
}

// columnIndex maps the outbox's column names, lower-cased, to their
// positions in the rows of the table map t: from t itself when the binlog
// holds the names (binlog_row_metadata = FULL), or else from
// information_schema. Those are read again after a statement logged alone
// (DDL) that names the outbox, and when t's columns do not fit them; rows
// whose columns still do not fit were logged before an ALTER TABLE the
// relay has not read yet: ErrColumnsChanged. Without names, the table map
// has no signedness either (NO_LOG): columnIndex marks t's unsigned columns
// from information_schema, so that they are decoded as such.
func (s *session) columnIndex(ctx context.Context, t *mysqlrepl.TableMapEvent) (map[string]int, error) {
	// The server maps the table again before each statement's rows.
	if s.idx != nil && sameColumns(s.mapped, t.Columns) {
		s.markUnsigned(t)
		return s.idx, nil
	}
	idx := make(map[string]int, len(t.Columns))
	for i, c := range t.Columns {
		if c.Name == "" {
			break
		}
		idx[strings.ToLower(c.Name)] = i
	}
	if len(idx) == len(t.Columns) {
		s.r.namesFrom(namesFromBinlog, "")
		s.idx, s.mapped, s.unsigned = idx, t.Columns, nil
		return idx, nil
	}
	fresh := s.columns == nil
	if fresh {
		if err := s.readColumns(ctx); err != nil {
			return nil, err
		}
	}
	diff := columnsDiffer(s.columns, t.Columns)
	if diff != "" && !fresh {
		// Changed by a statement the relay did not see (sql_log_bin = 0),
		// or read before a DDL.
		if err := s.readColumns(ctx); err != nil {
			return nil, err
		}
		diff = columnsDiffer(s.columns, t.Columns)
	}
	if diff != "" {
		return nil, fmt.Errorf("%w: %s, rows at %s:%d (GTID position %s): %s. The binlog holds no column names (binlog_row_metadata is not FULL): these rows were logged before an ALTER TABLE of the outbox that the relay has not read yet, and it cannot tell which value is which column",
			ErrColumnsChanged, s.r.sql.table, s.file, t.NextPos, s.pos.String(), diff)
	}
	s.r.namesFrom(namesFromSchema, "")
	idx = make(map[string]int, len(s.columns))
	s.unsigned = s.unsigned[:0]
	for i, c := range s.columns {
		idx[strings.ToLower(c.name)] = i
		s.unsigned = append(s.unsigned, c.unsigned)
	}
	s.idx, s.mapped = idx, t.Columns
	s.markUnsigned(t)
	return idx, nil
}

// readColumns reads the outbox's columns into s.columns.
func (s *session) readColumns(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, s.r.cfg.QueryTimeout)
	defer cancel()
	cols, err := s.r.readColumns(qctx)
	if err != nil {
		return err
	}
	s.columns = cols
	return nil
}

// markUnsigned marks the unsigned columns of a table map without
// signedness, as information_schema gave them.
func (s *session) markUnsigned(t *mysqlrepl.TableMapEvent) {
	for i, u := range s.unsigned {
		if u && i < len(t.Columns) {
			t.Columns[i].Unsigned = true
		}
	}
}

// sameColumns reports whether two table maps describe the same columns
// (signedness aside, which markUnsigned may have set).
func sameColumns(a, b []mysqlrepl.Column) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Type != b[i].Type || a[i].Meta != b[i].Meta || a[i].Nullable != b[i].Nullable || a[i].Name != b[i].Name {
			return false
		}
	}
	return true
}

// namesFrom logs where the relay reads the outbox's column names when that
// changes: at the start, from the server's binlog_row_metadata (setting),
// and while it runs, from the table maps it reads (a change of the setting,
// or binlog written before it).
func (r *source) namesFrom(from int32, setting string) {
	if r.names.Swap(from) == from {
		return
	}
	switch {
	case from == namesFromBinlog && setting != "":
		r.log.Info("reading the outbox's column names from the binlog", "binlog_row_metadata", setting)
	case from == namesFromBinlog:
		r.log.Info("the binlog holds the outbox's column names now: reading them from it")
	case setting != "":
		r.log.Info("reading the outbox's column names from information_schema: the binlog holds none; they are read again when the binlog shows a DDL statement on the outbox, and rows logged under other columns than the table's are not published under wrong names (see ErrColumnsChanged)",
			"binlog_row_metadata", setting)
	default:
		r.log.Info("the binlog holds no column names for the outbox now (binlog_row_metadata is not FULL): reading them from information_schema")
	}
}
