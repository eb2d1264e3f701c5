package binlog

import (
	"strings"
	"testing"
)

// TestCheckMySQLSettings: each MySQL setting the relay needs is named,
// with how to set it; MySQL 8's defaults but gtid_mode and
// enforce_gtid_consistency pass, binlog_row_metadata MINIMAL (its
// default) included; a short binlog retention is a warning.
func TestCheckMySQLSettings(t *testing.T) {
	good := mysqlSettings{version: "8.0.36", logBin: true, format: "ROW", rowImage: "FULL", rowMetadata: "MINIMAL",
		gtidMode: "ON", gtidConsistency: "ON", valueOptions: "", serverID: 1, expireSeconds: 2592000}
	for _, v := range []string{"8.0.36", "8.4.3", "9.1.0", "8.0.36-28-log"} {
		s := good
		s.version = v
		if w, err := checkMySQLSettings(s, 7); err != nil || len(w) != 0 {
			t.Fatalf("good settings of %s refused: %v %v", v, w, err)
		}
	}
	for _, tc := range []struct {
		change func(*mysqlSettings)
		want   string
	}{
		{func(s *mysqlSettings) { s.version = "5.7.44" }, "the binlog relay reads MySQL 8.0 or later"},
		{func(s *mysqlSettings) { s.logBin = false }, "the binary log is off"},
		{func(s *mysqlSettings) { s.gtidMode = "OFF" }, "gtid_mode is OFF: the relay's position is a GTID set"},
		{func(s *mysqlSettings) { s.gtidMode = "ON_PERMISSIVE" }, "SET GLOBAL gtid_mode = ON;"},
		{func(s *mysqlSettings) { s.gtidConsistency = "WARN" }, "enforce_gtid_consistency is WARN"},
		{func(s *mysqlSettings) { s.format = "MIXED" }, "SET GLOBAL binlog_format = 'ROW'"},
		{func(s *mysqlSettings) { s.rowImage = "MINIMAL" }, "SET GLOBAL binlog_row_image = 'FULL'"},
		{func(s *mysqlSettings) { s.valueOptions = "PARTIAL_JSON" }, "SET GLOBAL binlog_row_value_options = ''"},
		{func(s *mysqlSettings) { s.serverID = 7 }, "set Config.ServerID (--server-id)"},
	} {
		s := good
		tc.change(&s)
		_, err := checkMySQLSettings(s, 7)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", s, err, tc.want)
		}
	}
	// On a managed server each names the service's setting, never the
	// configuration file it has no access to.
	for _, host := range []managedServer{rds, aurora, cloudSQL, azure} {
		s := good
		s.host, s.logBin, s.gtidMode, s.format, s.valueOptions = host, false, "OFF", "MIXED", "PARTIAL_JSON"
		_, err := checkMySQLSettings(s, 7)
		if err == nil || strings.Contains(err.Error(), "[mysqld]") || strings.Contains(err.Error(), "SET GLOBAL") ||
			!strings.Contains(err.Error(), host.set("gtid_mode", "ON", false)) || !strings.Contains(err.Error(), host.logBinHint()) {
			t.Errorf("%v: %v", host, err)
		}
	}
	s := good
	s.expireSeconds = 3600
	if w, err := checkMySQLSettings(s, 7); err != nil || len(w) != 1 || !strings.Contains(w[0], "binlog_expire_logs_seconds is 3600 (1h0m0s)") {
		t.Errorf("a binlog kept an hour: %v, %v; want a warning", w, err)
	}
}

// TestPosition: a MySQL position is a GTID set, MariaDB's a GTID per
// domain, each read and written as its server does.
func TestPosition(t *testing.T) {
	const set = "3e11fa47-71ca-11e1-9e33-c80aa9429562:1-5:11,\n7c2f6a3e-0b1d-11ef-8a4b-0242ac120002:1-3"
	p, err := parsePosition(true, set)
	if err != nil || p.String() != strings.ReplaceAll(set, "\n", "") {
		t.Errorf("MySQL: %q, %v", p, err)
	}
	if _, err := parsePosition(true, "0-1-100"); err == nil {
		t.Error("a MariaDB position read as MySQL's")
	}
	if p, err := parsePosition(false, "0-1-100,1-2-3"); err != nil || p.String() != "0-1-100,1-2-3" {
		t.Errorf("MariaDB: %q, %v", p, err)
	}
	if _, err := parsePosition(false, set); err == nil {
		t.Error("a MySQL position read as MariaDB's")
	}
}
