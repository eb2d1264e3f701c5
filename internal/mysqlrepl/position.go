package mysqlrepl

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// GTID is a MariaDB global transaction id: domain-server-sequence.
type GTID struct {
	// Domain is the replication domain (gtid_domain_id).
	Domain uint32
	// Server is the server_id of the server that wrote the transaction.
	Server uint32
	// Seq is the sequence number in Domain.
	Seq uint64
}

// String returns "domain-server-seq".
func (g GTID) String() string { return fmt.Sprintf("%d-%d-%d", g.Domain, g.Server, g.Seq) }

// ParseGTID parses "domain-server-seq".
func ParseGTID(s string) (GTID, error) {
	a, b, ok1 := strings.Cut(s, "-")
	b, c, ok2 := strings.Cut(b, "-")
	if !ok1 || !ok2 {
		return GTID{}, fmt.Errorf("idem: mysqlrepl: GTID %q: want domain-server-sequence", s)
	}
	d, err1 := strconv.ParseUint(a, 10, 32)
	sv, err2 := strconv.ParseUint(b, 10, 32)
	q, err3 := strconv.ParseUint(c, 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return GTID{}, fmt.Errorf("idem: mysqlrepl: GTID %q: want three decimal numbers, domain-server-sequence", s)
	}
	return GTID{Domain: uint32(d), Server: uint32(sv), Seq: q}, nil
}

// Position is a MariaDB GTID position: the last GTID of each replication
// domain, as in @@gtid_binlog_pos and @slave_connect_state
// ("0-1-100,1-2-7"). The zero value is the empty position. A Position is a
// value: Update on a copy leaves the original alone.
type Position struct {
	gtids []GTID // sorted by domain, one per domain; never modified in place
}

// ParsePosition parses a comma-separated list of domain-server-seq, at most
// one per domain; spaces around entries are ignored, "" is the empty
// position.
func ParsePosition(s string) (Position, error) {
	var p Position
	if strings.TrimSpace(s) == "" {
		return p, nil
	}
	for part := range strings.SplitSeq(s, ",") {
		g, err := ParseGTID(strings.TrimSpace(part))
		if err != nil {
			return Position{}, fmt.Errorf("idem: mysqlrepl: position %q: %w", s, err)
		}
		if _, ok := p.Get(g.Domain); ok {
			return Position{}, fmt.Errorf("idem: mysqlrepl: position %q: domain %d twice", s, g.Domain)
		}
		p.Update(g)
	}
	return p, nil
}

// String returns the position as MariaDB writes it: domain-server-seq per
// domain, domains ascending, comma-separated; "" for the empty position.
func (p Position) String() string {
	parts := make([]string, len(p.gtids))
	for i, g := range p.gtids {
		parts[i] = g.String()
	}
	return strings.Join(parts, ",")
}

// IsZero reports whether p has no domain.
func (p Position) IsZero() bool { return len(p.gtids) == 0 }

// GTIDs returns the position's entries, domains ascending.
func (p Position) GTIDs() []GTID { return slices.Clone(p.gtids) }

// Get returns the entry of domain.
func (p Position) Get(domain uint32) (GTID, bool) {
	i, ok := p.find(domain)
	if !ok {
		return GTID{}, false
	}
	return p.gtids[i], true
}

func (p Position) find(domain uint32) (int, bool) {
	return slices.BinarySearchFunc(p.gtids, domain, func(g GTID, d uint32) int {
		switch {
		case g.Domain < d:
			return -1
		case g.Domain > d:
			return 1
		}
		return 0
	})
}

// Update makes g the entry of its domain.
func (p *Position) Update(g GTID) {
	i, ok := p.find(g.Domain)
	gtids := make([]GTID, 0, len(p.gtids)+1)
	gtids = append(gtids, p.gtids[:i]...)
	gtids = append(gtids, g)
	if ok {
		i++
	}
	p.gtids = append(gtids, p.gtids[i:]...)
}

// Contains reports whether g is at or before p's entry for its domain: the
// same domain, a sequence number no greater. (MariaDB sequence numbers grow
// within a domain, whichever server wrote them.)
func (p Position) Contains(g GTID) bool {
	e, ok := p.Get(g.Domain)
	return ok && g.Seq <= e.Seq
}
