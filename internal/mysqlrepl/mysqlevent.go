package mysqlrepl

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
)

// MySQLGTIDEvent (MySQL GTID_LOG_EVENT, 33, or ANONYMOUS_GTID_LOG_EVENT,
// 34) begins a transaction in a MySQL binlog: its GTID is SID:GNO. With
// gtid_mode OFF (or while it changes) the server writes anonymous ones,
// which name no transaction (Anonymous, SID and GNO zero).
type MySQLGTIDEvent struct {
	Header
	// Anonymous reports an ANONYMOUS_GTID_LOG_EVENT.
	Anonymous bool
	// SID is the source uuid, GNO the transaction's number for it.
	SID SID
	GNO uint64
	// GTIDFlags is the flags byte (0x1: the transaction may have statements
	// logged as such).
	GTIDFlags byte
	// LastCommitted and SequenceNumber are the logical clock of the
	// server's parallel replication (0 when absent).
	LastCommitted, SequenceNumber int64
	// ImmediateCommit is when the server that wrote this binlog committed
	// the transaction, to the microsecond; zero when the event has no such
	// field (before MySQL 8.0.1).
	ImmediateCommit time.Time
}

// PreviousGTIDsEvent (MySQL PREVIOUS_GTIDS_LOG_EVENT, 35) follows the
// format description of each binlog file: the GTIDs of every transaction
// before the file.
type PreviousGTIDsEvent struct {
	Header
	// GTIDs is the set.
	GTIDs GTIDSet
}

// TransactionPayloadEvent (MySQL TRANSACTION_PAYLOAD_EVENT, 40) holds a
// whole transaction's events, compressed, when the server runs with
// binlog_transaction_compression = ON: Events are those events decoded in
// order (its QUERY "BEGIN", TABLE_MAPs, rows events and XID; the GTID event
// comes before the payload, outside it). The inner events have no
// checksum of their own and no position: NextPos is that of the payload.
type TransactionPayloadEvent struct {
	Header
	// Compression is the algorithm: 0 zstd, 255 none.
	Compression uint64
	// UncompressedSize is the size of the events once decompressed.
	UncompressedSize uint64
	// Events are the transaction's events.
	Events []Event
}

// Fields of the type-length-value headers of MySQL's TRANSACTION_PAYLOAD
// and HEARTBEAT_LOG_EVENT_V2 (mysql-server, libbinlogevents): a packed
// type, a packed length, the value; type 0 ends the header.
const (
	otwEndMark          = 0
	otwPayloadSize      = 1
	otwCompressionType  = 2
	otwUncompressedSize = 3
	otwHBLogFilename    = 1
	otwHBLogPosition    = 2

	compressionZstd = 0
	compressionNone = 255

	// maxUncompressed bounds a transaction payload once decompressed:
	// what one logical packet may hold.
	maxUncompressed = maxPacket
)

func parseMySQLGTID(h Header, body []byte) (Event, error) {
	r := newReader(body)
	e := &MySQLGTIDEvent{Header: h, Anonymous: h.Type == MySQLAnonymousGTIDEventType}
	e.GTIDFlags = r.u8("flags")
	copy(e.SID[:], r.bytes(16, "source uuid"))
	gno := r.u64("GNO")
	if err := r.err(h.Type.String()); err != nil {
		return nil, err
	}
	if !e.Anonymous && (gno < 1 || gno > MaxGNO) {
		return nil, malformed("%s: GNO %d", h.Type, gno)
	}
	e.GNO = gno
	// What follows came with later versions: read what is there.
	if len(r.b) >= 17 && r.b[0] == 2 { // LOGICAL_TIMESTAMP_TYPECODE
		r.skip(1, "")
		e.LastCommitted = int64(r.u64(""))
		e.SequenceNumber = int64(r.u64(""))
		if len(r.b) >= 7 {
			us := leUint(r.bytes(7, "")) &^ (1 << 55) // the top bit says an original timestamp follows
			if us != 0 && us < 1<<53 {
				e.ImmediateCommit = time.UnixMicro(int64(us)).UTC()
			}
		}
	}
	return e, nil
}

// tlvHeader reads the type-length-value header of a TRANSACTION_PAYLOAD
// or HEARTBEAT_LOG_EVENT_V2, calling field for each field, and returns
// what follows its end mark.
func tlvHeader(r *reader, part string, field func(typ uint64, v []byte) error) ([]byte, error) {
	for r.ok {
		typ := r.lenenc("field type")
		if !r.ok {
			break
		}
		if typ == otwEndMark {
			return r.b, nil
		}
		v := r.bytes(r.count("field length", len(r.b)), "field")
		if !r.ok {
			break
		}
		if err := field(typ, v); err != nil {
			return nil, err
		}
	}
	if err := r.err(part); err != nil {
		return nil, err
	}
	return nil, malformed("%s: no end mark", part)
}

// packedValue reads v as one packed integer taking all of v.
func packedValue(v []byte, part, what string) (uint64, error) {
	r := newReader(v)
	n := r.lenenc(what)
	if !r.ok || len(r.b) != 0 {
		return 0, malformed("%s: %s is not a packed integer", part, what)
	}
	return n, nil
}

func parseHeartbeatV2(h Header, body []byte) (Event, error) {
	const part = "HEARTBEAT_LOG_EVENT_V2"
	e := &HeartbeatEvent{Header: h}
	_, err := tlvHeader(newReader(body), part, func(typ uint64, v []byte) error {
		var err error
		switch typ {
		case otwHBLogFilename:
			e.File = string(v)
		case otwHBLogPosition:
			e.LogPos, err = packedValue(v, part, "log position")
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

var zstdPool = sync.Pool{New: func() any {
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
	if err != nil {
		return err
	}
	return d
}}

// decompress returns the zstd frames of b decompressed, refusing more than
// want bytes, or an error naming part.
func decompress(b []byte, want uint64, part string) ([]byte, error) {
	v := zstdPool.Get()
	d, ok := v.(*zstd.Decoder)
	if !ok {
		return nil, v.(error)
	}
	defer func() {
		_ = d.Reset(nil)
		zstdPool.Put(d)
	}()
	if err := d.Reset(bytes.NewReader(b)); err != nil {
		return nil, malformed("%s: zstd: %v", part, err)
	}
	var out bytes.Buffer
	// Grows as the data really decompresses: a false size costs nothing.
	n, err := io.Copy(&out, io.LimitReader(d, int64(want)+1))
	switch {
	case err != nil:
		return nil, malformed("%s: zstd: %v", part, err)
	case uint64(n) != want:
		return nil, malformed("%s: %d bytes once decompressed, the event says %d", part, n, want)
	}
	return out.Bytes(), nil
}

func (p *Parser) parsePayload(h Header, body []byte) (Event, error) {
	const part = "TRANSACTION_PAYLOAD_EVENT"
	e := &TransactionPayloadEvent{Header: h}
	var size uint64
	sawSize := false
	payload, err := tlvHeader(newReader(body), part, func(typ uint64, v []byte) error {
		var err error
		switch typ {
		case otwPayloadSize:
			size, err = packedValue(v, part, "payload size")
			sawSize = true
		case otwCompressionType:
			e.Compression, err = packedValue(v, part, "compression type")
		case otwUncompressedSize:
			e.UncompressedSize, err = packedValue(v, part, "uncompressed size")
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if sawSize && size != uint64(len(payload)) {
		return nil, malformed("%s: payload of %d bytes, the header says %d", part, len(payload), size)
	}
	var raw []byte
	switch e.Compression {
	case compressionZstd:
		if e.UncompressedSize > maxUncompressed {
			return nil, malformed("%s: %d bytes once decompressed, more than %d", part, e.UncompressedSize, maxUncompressed)
		}
		if raw, err = decompress(payload, e.UncompressedSize, part); err != nil {
			return nil, err
		}
	case compressionNone:
		raw = payload
	default:
		return nil, unsupported("%s: compression type %d (only zstd, 0)", part, e.Compression)
	}
	for len(raw) > 0 {
		if len(raw) < HeaderLen {
			return nil, malformed("%s: %d bytes left, shorter than an event header", part, len(raw))
		}
		ih := parseHeader(raw)
		if ih.Size < HeaderLen || uint64(ih.Size) > uint64(len(raw)) {
			return nil, malformed("%s: inner %s of %d bytes, %d left", part, ih.Type, ih.Size, len(raw))
		}
		ih.NextPos = h.NextPos
		switch ih.Type {
		case FormatDescriptionEventType, RotateEventType, MySQLTransactionPayloadEventType, MySQLGTIDEventType,
			MySQLAnonymousGTIDEventType, MySQLPreviousGTIDsEventType, HeartbeatEventType, MySQLHeartbeatV2EventType:
			return nil, malformed("%s: holds a %s", part, ih.Type)
		}
		ev, err := p.parseBody(ih, raw[HeaderLen:ih.Size])
		if err != nil {
			return nil, err
		}
		e.Events = append(e.Events, ev)
		raw = raw[ih.Size:]
	}
	return e, nil
}

// errPartialJSON is the refusal of PARTIAL_UPDATE_ROWS_EVENT.
var errPartialJSON = errors.New("binlog_row_value_options = PARTIAL_JSON logs JSON updates as differences; the relay needs whole rows: SET GLOBAL binlog_row_value_options = ''")
