package cdc

import "testing"

// TestFailoverSlotDetection: slots are created with FAILOVER from
// PostgreSQL 17 on, told by the server_version parameter. (The servers of
// the tests are PostgreSQL 15: the command itself is not run on a 17.)
func TestFailoverSlotDetection(t *testing.T) {
	for v, want := range map[string]int{
		"15.18 (Debian 15.18-0+deb12u1)":   150018,
		"17.0":                             170000,
		"17beta1":                          170000,
		"18.1 (Ubuntu 18.1-1.pgdg24.04+2)": 180001,
		"9.6.24":                           90624,
		"":                                 0,
	} {
		if got := parseServerVersion(v); got != want {
			t.Errorf("parseServerVersion(%q) = %d, want %d", v, got, want)
		}
	}
	if got, want := createSlotCommand("s", 150018), "CREATE_REPLICATION_SLOT s LOGICAL pgoutput EXPORT_SNAPSHOT"; got != want {
		t.Errorf("on 15: %q, want %q", got, want)
	}
	if got, want := createSlotCommand("s", 170002), "CREATE_REPLICATION_SLOT s LOGICAL pgoutput (SNAPSHOT 'export', FAILOVER true)"; got != want {
		t.Errorf("on 17: %q, want %q", got, want)
	}
}
