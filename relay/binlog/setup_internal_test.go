package binlog

import (
	"strings"
	"testing"
)

// TestCheckSettings: each setting the relay needs is named, with how to
// set it; binlog_row_metadata is not one (the names come from
// information_schema without it).
func TestCheckSettings(t *testing.T) {
	good := serverSettings{version: "10.11.6-MariaDB-0+deb12u1-log", logBin: true, format: "ROW", rowImage: "FULL", rowMetadata: "NO_LOG", serverID: 1}
	for _, metadata := range []string{"NO_LOG", "MINIMAL", "FULL"} {
		s := good
		s.rowMetadata = metadata
		if err := checkSettings(s, 7); err != nil {
			t.Fatalf("good settings refused (binlog_row_metadata %s): %v", metadata, err)
		}
	}
	for _, tc := range []struct {
		change func(*serverSettings)
		want   string
	}{
		{func(s *serverSettings) { s.logBin = false }, "add log_bin = mariadb-bin"},
		{func(s *serverSettings) { s.format = "STATEMENT" }, "binlog_format is STATEMENT: the relay reads rows, and with STATEMENT every insert is logged as a statement"},
		{func(s *serverSettings) { s.format = "STATEMENT" }, "SET GLOBAL binlog_format = 'ROW'"},
		{func(s *serverSettings) { s.format = "MIXED" }, "binlog_format is MIXED: the relay reads rows, and with MIXED an insert of plain values is logged as a statement"},
		{func(s *serverSettings) { s.rowImage = "MINIMAL" }, "SET GLOBAL binlog_row_image = 'FULL'"},
		{func(s *serverSettings) { s.rowImage = "NOBLOB" }, "binlog_row_image is NOBLOB"},
		{func(s *serverSettings) { s.compress = true }, "SET GLOBAL log_bin_compress = 'OFF'"},
		{func(s *serverSettings) { s.serverID = 7 }, "set Config.ServerID (--server-id)"},
	} {
		s := good
		tc.change(&s)
		err := checkSettings(s, 7)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", s, err, tc.want)
		}
	}
}

func TestCheckPrivileges(t *testing.T) {
	if err := checkPrivileges("'relay'@'%'", []string{"SELECT", "REPLICATION SLAVE", "BINLOG MONITOR"}); err != nil {
		t.Errorf("MariaDB 10.5+ names refused: %v", err)
	}
	if err := checkPrivileges("'relay'@'%'", []string{"REPLICATION SLAVE", "REPLICATION CLIENT"}); err != nil {
		t.Errorf("older names refused: %v", err)
	}
	err := checkPrivileges("'relay'@'%'", []string{"SELECT"})
	if err == nil || !strings.Contains(err.Error(), "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'relay'@'%'") {
		t.Errorf("no privileges: %v", err)
	}
	if g := grantee("relay@10.0.0.%"); g != "'relay'@'10.0.0.%'" {
		t.Errorf("grantee = %s", g)
	}
}

func TestSavepoint(t *testing.T) {
	rollback := []string{"ROLLBACK TO SAVEPOINT", "ROLLBACK TO", "ROLLBACK WORK TO SAVEPOINT", "ROLLBACK WORK TO"}
	for _, tc := range []struct {
		q, name  string
		prefixes []string
		ok       bool
	}{
		{"SAVEPOINT `sp1`", "sp1", []string{"SAVEPOINT"}, true},
		{"savepoint a", "a", []string{"SAVEPOINT"}, true},
		{"ROLLBACK TO `sp1`", "sp1", rollback, true},
		{"ROLLBACK TO SAVEPOINT `sp1`", "sp1", rollback, true},
		{"rollback work to savepoint b", "b", rollback, true},
		{"ROLLBACK", "", rollback, false},
		{"SAVEPOINTS", "", []string{"SAVEPOINT"}, false},
	} {
		name, ok := savepoint(tc.q, tc.prefixes...)
		if name != tc.name || ok != tc.ok {
			t.Errorf("savepoint(%q) = %q, %v", tc.q, name, ok)
		}
	}
}
