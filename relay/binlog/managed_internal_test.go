package binlog

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/internal/testdb"
)

// TestManagedServerHints: a managed server is told from its variables, and
// each start-up error names the setting of its service, not the
// configuration file it has no access to.
func TestManagedServerHints(t *testing.T) {
	for _, tc := range []struct {
		name  string
		signs serverSigns
		want  managedServer
		// logBin, format, grant: texts the errors must hold.
		logBin, format, grant string
	}{
		{"self-hosted MariaDB", serverSigns{basedir: "/usr/", versionComment: "Debian 12"}, selfHosted,
			"add log_bin = mariadb-bin", "SET GLOBAL binlog_format = 'ROW' and binlog_format = ROW in the [mysqld] section", "TO 'relay'@'%'"},
		{"RDS for MariaDB", serverSigns{basedir: "/rdsdbbin/mariadb-10.11.8.R1/", versionComment: "Source distribution"}, rds,
			"automated backups", "on Amazon RDS set binlog_format = ROW in the instance's DB parameter group", "(as the instance's master user)"},
		{"RDS for MySQL", serverSigns{basedir: "/rdsdbbin/mysql-8.0.39.R2/", versionComment: "Source distribution"}, rds,
			"automated backups", "DB parameter group", "master user"},
		{"Aurora MySQL", serverSigns{basedir: "/rdsdbbin/oscar-8.0.mysql_aurora.3.05.2/", names: []string{"aurora_version", "aurora_binlog_replication_max_yield_seconds"}}, aurora,
			"DB cluster parameter group and reboot the writer instance, which turns the binary log on", "on Aurora MySQL set binlog_format = ROW in the DB cluster parameter group", "master user"},
		{"Cloud SQL", serverSigns{basedir: "/usr/", names: []string{"cloudsql_iam_authentication"}}, cloudSQL,
			"--enable-bin-log", "database flag binlog_format=ROW", "cloudsqlsuperuser"},
		{"Azure", serverSigns{basedir: "/usr/", names: []string{"aad_auth_only"}}, azure,
			"always on", "server parameter binlog_format = ROW (az mysql flexible-server parameter set", "administrator login"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.signs.detect()
			if m != tc.want {
				t.Fatalf("detected %v, want %v", m, tc.want)
			}
			s := serverSettings{version: "10.11.6-MariaDB-log", format: "STATEMENT", rowImage: "FULL", serverID: 1, host: m}
			err := checkSettings(s, 7)
			if err == nil || !strings.Contains(err.Error(), tc.logBin) || !strings.Contains(err.Error(), tc.format) {
				t.Errorf("settings: %v\nwant %q and %q", err, tc.logBin, tc.format)
			}
			if m != selfHosted && err != nil && strings.Contains(err.Error(), "[mysqld]") {
				t.Errorf("a managed server told to edit its configuration file: %v", err)
			}
			perr := checkPrivileges("'relay'@'%'", nil)
			if got := perr.Error() + m.grantHint(); !strings.Contains(got, tc.grant) {
				t.Errorf("privileges: %s\nwant %q", got, tc.grant)
			}
		})
	}
}

// TestSelfHostedDetected: the test servers, the shared one and one of the
// test's own with MariaDB's defaults, are told as self-hosted.
func TestSelfHostedDetected(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, u := range []string{testdb.MariaDBURL(t), testdb.StartMariaDB(t).URL} {
		db, err := mysql.Open(u)
		if err != nil {
			t.Fatal(err)
		}
		signs := readSigns(ctx, db)
		_ = db.Close()
		if signs.basedir == "" || signs.versionComment == "" {
			t.Errorf("signs not read: %+v", signs)
		}
		if m := signs.detect(); m != selfHosted {
			t.Errorf("detected %v from %+v, want a self-hosted server", m, signs)
		}
	}
}
