package binlogtest

import (
	"encoding/binary"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Packed returns n as a packed (length-encoded) integer.
func Packed(n uint64) []byte {
	switch {
	case n < 251:
		return []byte{byte(n)}
	case n < 1<<16:
		return []byte{0xfc, byte(n), byte(n >> 8)}
	case n < 1<<24:
		return []byte{0xfd, byte(n), byte(n >> 8), byte(n >> 16)}
	}
	return binary.LittleEndian.AppendUint64([]byte{0xfe}, n)
}

// GTIDBody returns the body of a GTID_LOG_EVENT (33) as MySQL 8.0 writes
// it (libbinlogevents Gtid_event): flags, the source uuid, the transaction
// number, the logical clock (type 2, last committed 4, sequence number 5),
// the immediate commit timestamp (microseconds, 7 bytes), the transaction
// length (packed) and the server version. An anonymous GTID event (34) has
// the same body with a zero uuid and number.
func GTIDBody(sid [16]byte, gno uint64, commit time.Time) []byte {
	b := []byte{1}
	b = append(b, sid[:]...)
	b = binary.LittleEndian.AppendUint64(b, gno)
	b = append(b, 2)
	b = binary.LittleEndian.AppendUint64(b, 4)
	b = binary.LittleEndian.AppendUint64(b, 5)
	us := binary.LittleEndian.AppendUint64(nil, uint64(commit.UnixMicro()))
	b = append(b, us[:7]...)
	b = append(b, Packed(300)...)
	return binary.LittleEndian.AppendUint32(b, 80036)
}

// The fields of the type-length-value headers of TRANSACTION_PAYLOAD and
// HEARTBEAT_LOG_EVENT_V2.
const (
	fieldEnd              = 0
	fieldPayloadSize      = 1
	fieldCompressionType  = 2
	fieldUncompressedSize = 3
	fieldLogFilename      = 1
	fieldLogPosition      = 2
)

// Field is a field of a type-length-value header whose value is a packed
// integer.
type Field struct {
	Type, Value uint64
}

// TLV returns a header of fields, ended: a packed type, a packed length
// and the value, a packed integer, for each.
func TLV(fields ...Field) []byte {
	var b []byte
	for _, f := range fields {
		v := Packed(f.Value)
		b = append(b, Packed(f.Type)...)
		b = append(b, Packed(uint64(len(v)))...)
		b = append(b, v...)
	}
	return append(b, fieldEnd)
}

// Compression types of TRANSACTION_PAYLOAD.
const (
	CompressionZstd = 0
	CompressionNone = 255
)

// PayloadBody returns the body of a TRANSACTION_PAYLOAD_EVENT (40) holding
// events (whole events, header included, without checksums, as MySQL
// stores them in a payload), compressed with zstd unless none.
func PayloadBody(none bool, events ...[]byte) []byte {
	var raw []byte
	for _, e := range events {
		raw = append(raw, e...)
	}
	payload, typ := raw, uint64(CompressionNone)
	if !none {
		enc, err := zstd.NewWriter(nil)
		if err != nil {
			panic(err) // only for invalid options
		}
		payload, typ = enc.EncodeAll(raw, nil), CompressionZstd
		_ = enc.Close()
	}
	h := TLV(Field{fieldPayloadSize, uint64(len(payload))}, Field{fieldCompressionType, typ}, Field{fieldUncompressedSize, uint64(len(raw))})
	return append(h, payload...)
}

// HeartbeatV2Body returns the body of a HEARTBEAT_LOG_EVENT_V2 (41): the
// binlog file's name and the position.
func HeartbeatV2Body(file string, pos uint64) []byte {
	b := append([]byte{fieldLogFilename}, Packed(uint64(len(file)))...)
	b = append(b, file...)
	v := Packed(pos)
	b = append(b, fieldLogPosition)
	b = append(b, Packed(uint64(len(v)))...)
	b = append(b, v...)
	return append(b, fieldEnd)
}
