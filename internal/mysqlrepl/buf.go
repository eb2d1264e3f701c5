package mysqlrepl

import "encoding/binary"

// reader reads little-endian fields from b, recording the first shortage in
// ok instead of panicking: every decoder reads through it and checks ok (or
// err) before trusting what it read.
type reader struct {
	b    []byte
	ok   bool
	what string // the field that was short, for the error
}

func newReader(b []byte) *reader { return &reader{b: b, ok: true} }

func (r *reader) fail(what string) {
	if r.ok {
		r.ok = false
		r.what = what
	}
	r.b = nil
}

// err returns nil, or an ErrMalformed naming the event part and the field
// that was short.
func (r *reader) err(part string) error {
	if r.ok {
		return nil
	}
	return malformed("%s: truncated at %s", part, r.what)
}

func (r *reader) bytes(n int, what string) []byte {
	if !r.ok || n < 0 || n > len(r.b) {
		r.fail(what)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) skip(n int, what string) { r.bytes(n, what) }

func (r *reader) u8(what string) uint8 {
	b := r.bytes(1, what)
	if b == nil {
		return 0
	}
	return b[0]
}

func (r *reader) u16(what string) uint16 {
	b := r.bytes(2, what)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint16(b)
}

func (r *reader) u32(what string) uint32 {
	b := r.bytes(4, what)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (r *reader) u64(what string) uint64 {
	b := r.bytes(8, what)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// uN reads an n-byte (1..8) little-endian unsigned integer.
func (r *reader) uN(n int, what string) uint64 {
	b := r.bytes(n, what)
	if b == nil {
		return 0
	}
	return leUint(b)
}

// lenenc reads a packed (length-encoded) integer; 0xfb (NULL) and 0xff are
// refused.
func (r *reader) lenenc(what string) uint64 {
	c := r.u8(what)
	switch {
	case !r.ok:
		return 0
	case c < 0xfb:
		return uint64(c)
	case c == 0xfc:
		return r.uN(2, what)
	case c == 0xfd:
		return r.uN(3, what)
	case c == 0xfe:
		return r.u64(what)
	}
	r.fail(what + " (invalid length-encoded integer)")
	return 0
}

// count reads a packed integer used as a count or a length and refuses
// one above limit (what remains of the input, in the unit counted), which
// keeps every allocation bounded by the input's size.
func (r *reader) count(what string, limit int) int {
	v := r.lenenc(what)
	if !r.ok {
		return 0
	}
	if v > uint64(limit) {
		r.fail(what + " (too large)")
		return 0
	}
	return int(v)
}

func leUint(b []byte) uint64 {
	var v uint64
	for i := len(b) - 1; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}

func beUint(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}
