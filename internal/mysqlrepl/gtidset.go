package mysqlrepl

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// SID is a MySQL source id: the server_uuid of the server that first ran a
// transaction, the first part of its GTID.
type SID [16]byte

// ParseSID parses a uuid in its text form (8-4-4-4-12 hexadecimal digits).
func ParseSID(s string) (SID, error) {
	var sid SID
	h := strings.ReplaceAll(s, "-", "")
	if len(s) != 36 || len(h) != 32 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return sid, fmt.Errorf("idem: mysqlrepl: source uuid %q: want 8-4-4-4-12 hexadecimal digits", s)
	}
	if _, err := hex.Decode(sid[:], []byte(h)); err != nil {
		return sid, fmt.Errorf("idem: mysqlrepl: source uuid %q: want 8-4-4-4-12 hexadecimal digits", s)
	}
	return sid, nil
}

// String returns the uuid in MySQL's form: lower case, 8-4-4-4-12.
func (s SID) String() string {
	var b [36]byte
	hex.Encode(b[0:8], s[0:4])
	b[8] = '-'
	hex.Encode(b[9:13], s[4:6])
	b[13] = '-'
	hex.Encode(b[14:18], s[6:8])
	b[18] = '-'
	hex.Encode(b[19:23], s[8:10])
	b[23] = '-'
	hex.Encode(b[24:], s[10:])
	return string(b[:])
}

// Interval is a range of a source's transaction numbers, both ends
// included (MySQL's text form "1-5"; "7" is 7-7).
type Interval struct {
	Start, End uint64
}

// sidSet is the transactions of one source.
type sidSet struct {
	sid       SID
	intervals []Interval // ascending, disjoint, not adjacent
}

// GTIDSet is a MySQL GTID set, as in @@global.gtid_executed and the
// COM_BINLOG_DUMP_GTID command: for each source uuid, the intervals of its
// transaction numbers ("3E11FA47-71CA-11E1-9E33-C80AA9429562:1-5:11-18,
// 7c2f...:1-3"). The zero value is the empty set. A GTIDSet is a value: Add
// on a copy leaves the original alone.
type GTIDSet struct {
	sids []sidSet // ascending by sid; never modified in place
}

// MaxGNO is the largest transaction number MySQL gives (GNO_END - 1).
const MaxGNO = 1<<63 - 2

// ParseGTIDSet parses a GTID set in MySQL's text form: source entries
// separated by commas, each a uuid followed by ":interval" parts, an
// interval being "N" or "N-M" (1 <= N <= M). Spaces and newlines around
// the parts are ignored (@@gtid_executed puts a newline after each comma);
// the same source may come twice and intervals may overlap, as MySQL
// accepts: they are merged. "" is the empty set. Tagged GTIDs (MySQL 8.3+,
// "uuid:tag:1-5") are refused with an error wrapping ErrUnsupported.
func ParseGTIDSet(s string) (GTIDSet, error) {
	var set GTIDSet
	if strings.TrimSpace(s) == "" {
		return set, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		fields := strings.Split(part, ":")
		sid, err := ParseSID(strings.TrimSpace(fields[0]))
		if err != nil {
			return GTIDSet{}, fmt.Errorf("idem: mysqlrepl: GTID set %q: %w", s, err)
		}
		if len(fields) == 1 {
			return GTIDSet{}, fmt.Errorf("idem: mysqlrepl: GTID set %q: source %s without a transaction interval (uuid:1-N)", s, fields[0])
		}
		for _, f := range fields[1:] {
			f = strings.TrimSpace(f)
			iv, err := parseInterval(f)
			if err != nil {
				if f != "" && (f[0] < '0' || f[0] > '9') {
					return GTIDSet{}, fmt.Errorf("%w: GTID set %q: tagged GTIDs (%s, MySQL 8.3+) are not read: use untagged GTIDs for the transactions of the outbox's database", ErrUnsupported, s, f)
				}
				return GTIDSet{}, fmt.Errorf("idem: mysqlrepl: GTID set %q: %w", s, err)
			}
			set.addInterval(sid, iv)
		}
	}
	return set, nil
}

func parseInterval(s string) (Interval, error) {
	a, b, rng := strings.Cut(s, "-")
	start, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return Interval{}, fmt.Errorf("interval %q: want N or N-M", s)
	}
	end := start
	if rng {
		if end, err = strconv.ParseUint(b, 10, 64); err != nil {
			return Interval{}, fmt.Errorf("interval %q: want N or N-M", s)
		}
	}
	if start < 1 || end < start || end > MaxGNO {
		return Interval{}, fmt.Errorf("interval %q: want 1 <= N <= M <= %d", s, uint64(MaxGNO))
	}
	return Interval{Start: start, End: end}, nil
}

// String returns the set as MySQL writes it, without newlines: sources by
// uuid ascending (lower case), intervals ascending, "N" for a one-number
// interval; "" for the empty set.
func (s GTIDSet) String() string {
	var b strings.Builder
	for i, e := range s.sids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.sid.String())
		for _, iv := range e.intervals {
			b.WriteByte(':')
			b.WriteString(strconv.FormatUint(iv.Start, 10))
			if iv.End != iv.Start {
				b.WriteByte('-')
				b.WriteString(strconv.FormatUint(iv.End, 10))
			}
		}
	}
	return b.String()
}

// IsZero reports whether the set is empty.
func (s GTIDSet) IsZero() bool { return len(s.sids) == 0 }

// SIDs returns the set's sources, ascending.
func (s GTIDSet) SIDs() []SID {
	out := make([]SID, len(s.sids))
	for i, e := range s.sids {
		out[i] = e.sid
	}
	return out
}

// Intervals returns the intervals of sid, ascending; nil when the set has
// none.
func (s GTIDSet) Intervals(sid SID) []Interval {
	i, ok := s.find(sid)
	if !ok {
		return nil
	}
	return slices.Clone(s.sids[i].intervals)
}

func (s GTIDSet) find(sid SID) (int, bool) {
	return slices.BinarySearchFunc(s.sids, sid, func(e sidSet, t SID) int { return bytes.Compare(e.sid[:], t[:]) })
}

// Contains reports whether the transaction sid:gno is in the set.
func (s GTIDSet) Contains(sid SID, gno uint64) bool {
	i, ok := s.find(sid)
	if !ok {
		return false
	}
	ivs := s.sids[i].intervals
	j, _ := slices.BinarySearchFunc(ivs, gno, func(iv Interval, g uint64) int {
		if iv.End < g {
			return -1
		}
		return 1
	})
	return j < len(ivs) && ivs[j].Start <= gno
}

// ContainsSet reports whether every transaction of o is in s.
func (s GTIDSet) ContainsSet(o GTIDSet) bool {
	for _, e := range o.sids {
		i, ok := s.find(e.sid)
		if !ok {
			return false
		}
		for _, iv := range e.intervals {
			if !covers(s.sids[i].intervals, iv) {
				return false
			}
		}
	}
	return true
}

func covers(ivs []Interval, iv Interval) bool {
	for _, x := range ivs {
		if x.Start <= iv.Start && iv.End <= x.End {
			return true
		}
	}
	return false
}

// Add adds the transaction sid:gno (1 <= gno <= MaxGNO; others are
// ignored).
func (s *GTIDSet) Add(sid SID, gno uint64) {
	if gno < 1 || gno > MaxGNO {
		return
	}
	s.addInterval(sid, Interval{Start: gno, End: gno})
}

// addInterval merges iv into the intervals of sid, copying what it
// changes.
func (s *GTIDSet) addInterval(sid SID, iv Interval) {
	i, ok := s.find(sid)
	if !ok {
		s.sids = slices.Insert(slices.Clone(s.sids), i, sidSet{sid: sid, intervals: []Interval{iv}})
		return
	}
	old := s.sids[i].intervals
	ivs := make([]Interval, 0, len(old)+1)
	placed := false
	for _, x := range old {
		switch {
		case placed || x.End+1 < iv.Start: // before iv, not adjacent (or iv is in)
			ivs = append(ivs, x)
		case iv.End+1 < x.Start: // after iv: iv goes first
			ivs = append(ivs, iv, x)
			placed = true
		default: // overlapping or adjacent: merged into iv
			iv = Interval{Start: min(iv.Start, x.Start), End: max(iv.End, x.End)}
		}
	}
	if !placed {
		ivs = append(ivs, iv)
	}
	sids := slices.Clone(s.sids)
	sids[i] = sidSet{sid: sid, intervals: ivs}
	s.sids = sids
}

// Encode returns the set in MySQL's binary form, the data of
// COM_BINLOG_DUMP_GTID and the body of a PREVIOUS_GTIDS event:
// the number of sources (8 bytes), then for each its uuid (16 bytes), its
// number of intervals (8 bytes) and each interval's start and end, the end
// excluded (8 bytes each), all little-endian.
func (s GTIDSet) Encode() []byte {
	n := 8
	for _, e := range s.sids {
		n += 16 + 8 + 16*len(e.intervals)
	}
	b := make([]byte, 0, n)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s.sids)))
	for _, e := range s.sids {
		b = append(b, e.sid[:]...)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(e.intervals)))
		for _, iv := range e.intervals {
			b = binary.LittleEndian.AppendUint64(b, iv.Start)
			b = binary.LittleEndian.AppendUint64(b, iv.End+1)
		}
	}
	return b
}

// DecodeGTIDSet decodes a GTID set in MySQL's binary form (see Encode).
// The tagged form of MySQL 8.3+ (a format byte in the count's top byte) is
// refused with an error wrapping ErrUnsupported; anything else malformed
// with an error wrapping ErrMalformed.
func DecodeGTIDSet(b []byte) (GTIDSet, error) {
	var set GTIDSet
	r := newReader(b)
	n := r.u64("source count")
	if r.ok && n>>56 != 0 {
		return set, unsupported("GTID set in the tagged format of MySQL 8.3+ (format %d): tagged GTIDs are not read", n>>56)
	}
	if n > uint64(len(r.b))/24 {
		return set, malformed("GTID set: %d sources in %d bytes", n, len(r.b))
	}
	for range n {
		var sid SID
		copy(sid[:], r.bytes(16, "source uuid"))
		m := r.u64("interval count")
		if m > uint64(len(r.b))/16 {
			return GTIDSet{}, malformed("GTID set: %d intervals in %d bytes", m, len(r.b))
		}
		for range m {
			start, end := r.u64("interval start"), r.u64("interval end")
			if !r.ok {
				break
			}
			if start < 1 || end <= start || end-1 > MaxGNO {
				return GTIDSet{}, malformed("GTID set: interval [%d, %d) of %s", start, end, sid)
			}
			set.addInterval(sid, Interval{Start: start, End: end - 1})
		}
	}
	if err := r.err("GTID set"); err != nil {
		return GTIDSet{}, err
	}
	if len(r.b) != 0 {
		return GTIDSet{}, malformed("GTID set: %d bytes left over", len(r.b))
	}
	return set, nil
}
