package mysql8test

import (
	"time"

	"vitess.io/vitess/go/mysql"
	"vitess.io/vitess/go/mysql/replication"

	"github.com/idem-go/idem/internal/mysqlrepl/binlogtest"
)

// Event types MySQL 8 writes that vitess's builders do not.
const (
	gtidEvent          = 33
	previousGTIDsEvent = 35
	payloadEvent       = 40
	heartbeatV2Event   = 41
)

// mysql8HeaderSizes are the post-header lengths of a MySQL 8.0 format
// description, up to HEARTBEAT_LOG_EVENT_V2 (41): QUERY 13, ROTATE 8,
// TABLE_MAP 8, rows v1 8, rows v2 10, GTID and anonymous GTID 42,
// TRANSACTION_PAYLOAD 40.
var mysql8HeaderSizes = []byte{
	56, 13, 0, 8, 0, 18, 0, 4, 4, 4, 4, 18, 0, 0, 98, 0, 4, 26, 8, 0,
	0, 0, 8, 8, 8, 2, 0, 0, 0, 10, 10, 10, 42, 42, 0, 18, 52, 0, 0, 40, 0,
}

// Binlog builds a MySQL 8 binlog with vitess's builders (format
// description, rotate, query, table map, rows, XID, heartbeat), and the
// events they lack with binlogtest (GTID, previous GTIDs, transaction
// payload, heartbeat v2), each packetized by vitess (header, CRC32).
type Binlog struct {
	F mysql.BinlogFormat
	S *mysql.FakeBinlogStream
}

// NewBinlog returns a builder for a MySQL 8.0.36 binlog with CRC32
// checksums, written by server_id 1.
func NewBinlog() *Binlog {
	return &Binlog{
		F: mysql.BinlogFormat{FormatVersion: 4, ServerVersion: "8.0.36", HeaderLength: 19,
			ChecksumAlgorithm: mysql.BinlogChecksumAlgCRC32, HeaderSizes: mysql8HeaderSizes},
		S: mysql.NewFakeBinlogStream(),
	}
}

// next advances the stream's position past an event of n bytes.
func (b *Binlog) next(ev mysql.BinlogEvent) mysql.BinlogEvent {
	b.S.LogPosition += uint32(len(ev.Bytes()))
	return ev
}

// Start returns what a dump begins with: a fake rotate to file, the
// format description and the previous GTIDs.
func (b *Binlog) Start(file string, previous replication.Mysql56GTIDSet) []mysql.BinlogEvent {
	b.S.LogPosition = 0
	rot := mysql.NewFakeRotateEvent(b.F, b.S, file)
	b.S.LogPosition = 4
	return []mysql.BinlogEvent{rot, b.next(mysql.NewFormatDescriptionEvent(b.F, b.S)), b.next(b.raw(previousGTIDsEvent, previous.SIDBlock()))}
}

func (b *Binlog) raw(typ byte, body []byte) mysql.BinlogEvent {
	return mysql.NewMysql56BinlogEvent(b.S.Packetize(b.F, typ, 0, body))
}

// GTID returns a GTID_LOG_EVENT of sid:gno.
func (b *Binlog) GTID(sid replication.SID, gno uint64) mysql.BinlogEvent {
	return b.next(b.raw(gtidEvent, binlogtest.GTIDBody(sid, gno, time.Unix(int64(b.S.Timestamp), 0))))
}

// Query returns a QUERY_EVENT of sql in db.
func (b *Binlog) Query(db, sql string) mysql.BinlogEvent {
	return b.next(mysql.NewQueryEvent(b.F, b.S, mysql.Query{Database: db, SQL: sql}))
}

// TableMap returns a TABLE_MAP_EVENT of tm under id, with optional
// metadata opt (type-length-value fields of binlog_row_metadata) after
// what vitess builds.
func (b *Binlog) TableMap(id uint64, tm *mysql.TableMap, opt []byte) mysql.BinlogEvent {
	ev := mysql.NewTableMapEvent(b.F, b.S, id, tm)
	if opt != nil {
		body := ev.Bytes()[b.F.HeaderLength : len(ev.Bytes())-4]
		ev = b.raw(19, append(append([]byte(nil), body...), opt...))
	}
	return b.next(ev)
}

// WriteRows returns a WRITE_ROWS_EVENT (v2) of rows.
func (b *Binlog) WriteRows(id uint64, rows mysql.Rows) mysql.BinlogEvent {
	return b.next(mysql.NewWriteRowsEvent(b.F, b.S, id, rows))
}

// XID returns an XID_EVENT.
func (b *Binlog) XID() mysql.BinlogEvent { return b.next(mysql.NewXIDEvent(b.F, b.S)) }

// Payload returns a TRANSACTION_PAYLOAD_EVENT holding events, stored as
// MySQL stores them there: without their checksums.
func (b *Binlog) Payload(none bool, events ...mysql.BinlogEvent) mysql.BinlogEvent {
	var inner [][]byte
	for _, ev := range events {
		raw := ev.Bytes()
		raw = append([]byte(nil), raw[:len(raw)-4]...)
		n := uint32(len(raw))
		raw[9], raw[10], raw[11], raw[12] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
		raw[13], raw[14], raw[15], raw[16] = 0, 0, 0, 0
		inner = append(inner, raw)
	}
	return b.next(b.raw(payloadEvent, binlogtest.PayloadBody(none, inner...)))
}

// HeartbeatV2 returns a HEARTBEAT_LOG_EVENT_V2 at file:pos.
func (b *Binlog) HeartbeatV2(file string, pos uint64) mysql.BinlogEvent {
	return b.raw(heartbeatV2Event, binlogtest.HeartbeatV2Body(file, pos))
}

// Write sends events on a dump connection.
func Write(c *mysql.Conn, events ...mysql.BinlogEvent) error {
	for _, ev := range events {
		if err := c.WriteBinlogEvent(ev, false); err != nil {
			return err
		}
	}
	return c.FlushWriteBuffer()
}
