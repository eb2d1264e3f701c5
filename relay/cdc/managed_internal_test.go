package cdc

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/internal/testdb"
)

// TestManagedServerHints: a managed server is told from its roles and
// settings, and each start-up error names the setting of its service, not
// postgresql.conf or pg_hba.conf, which it has no access to.
func TestManagedServerHints(t *testing.T) {
	for _, tc := range []struct {
		name  string
		signs serverSigns
		want  managedServer
		// wal, repl, slots, hba: texts the errors must hold.
		wal, repl, slots, hba string
	}{
		{"self-hosted", serverSigns{}, selfHosted,
			"set wal_level = logical in postgresql.conf", "ALTER ROLE relay REPLICATION", "max_replication_slots in postgresql.conf", "pg_hba.conf needs a line"},
		{"RDS", serverSigns{rdsRoles: true, rdsSettings: true}, rds,
			"on Amazon RDS set rds.logical_replication = 1 in the instance's DB parameter group and reboot the instance",
			"GRANT rds_replication TO relay", "on Amazon RDS set max_replication_slots", "check the instance's security group"},
		{"RDS, roles only", serverSigns{rdsRoles: true}, rds, "rds.logical_replication = 1", "rds_replication", "DB parameter group", "rds_replication"},
		{"Aurora", serverSigns{rdsRoles: true, rdsSettings: true, auroraVersion: true}, aurora,
			"on Aurora PostgreSQL set rds.logical_replication = 1 in the DB cluster parameter group and reboot the writer instance",
			"GRANT rds_replication TO relay", "DB cluster parameter group", "rds_replication"},
		{"Cloud SQL", serverSigns{cloudSQLSettings: true}, cloudSQL,
			"on Cloud SQL set the database flag cloudsql.logical_decoding=on", "ALTER ROLE relay WITH REPLICATION, as a member of cloudsqlsuperuser",
			"database flag max_replication_slots", "authorized networks"},
		{"Azure", serverSigns{azureSettings: true}, azure,
			"on Azure set the server parameter wal_level = logical", "ALTER ROLE relay WITH REPLICATION, as the server's administrator",
			"server parameter max_replication_slots", "firewall rules"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.signs.detect()
			if m != tc.want {
				t.Fatalf("detected %v, want %v", m, tc.want)
			}
			errs := map[string]error{
				"wal_level":   slotErrorOn(m, &pgconn.PgError{Code: "55000", Message: "logical decoding requires wal_level >= logical"}, "s", "relay"),
				"REPLICATION": replicationErrorOn(m, &pgconn.PgError{Code: "42501", Message: "must be superuser or replication role"}, "relay"),
				"slots":       slotErrorOn(m, &pgconn.PgError{Code: "53400", Message: "all replication slots are in use"}, "s", "relay"),
				"hba":         replicationErrorOn(m, &pgconn.PgError{Code: "28000", Message: "no pg_hba.conf entry for replication connection"}, "relay"),
			}
			for what, want := range map[string]string{"wal_level": tc.wal, "REPLICATION": tc.repl, "slots": tc.slots, "hba": tc.hba} {
				got := errs[what].Error()
				if !strings.Contains(got, want) {
					t.Errorf("%s: %s\nwant %q", what, got, want)
				}
				// The server's own message names pg_hba.conf: look after it.
				hint := got[strings.LastIndex(got, ": ")+2:]
				if m != selfHosted && (strings.Contains(hint, "postgresql.conf") || strings.Contains(hint, "pg_hba.conf needs")) {
					t.Errorf("%s: a managed server told to edit its files: %s", what, got)
				}
			}
			if !strings.Contains(m.walLevelHint(), strings.TrimPrefix(tc.wal, "set ")) {
				t.Errorf("wal_level at start-up: %s, want %q", m.walLevelHint(), tc.wal)
			}
		})
	}
}

// TestSelfHostedDetected: the test server is told as self-hosted.
func TestSelfHostedDetected(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, testdb.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var s serverSigns
	if err := pool.QueryRow(ctx, signsSQL).Scan(&s.rdsRoles, &s.rdsSettings, &s.auroraVersion, &s.cloudSQLSettings, &s.azureSettings); err != nil {
		t.Fatalf("read the signs: %v", err)
	}
	if m := readSigns(ctx, pool).detect(); m != selfHosted || s != (serverSigns{}) {
		t.Errorf("detected %v from %+v, want a self-hosted server", m, s)
	}
}

// TestDropSlotOnManagedServer: DropSlot's errors name a managed server's
// own role, as the relay's start-up errors do. The server of the test's
// own has RDS's replication role, which is what tells RDS apart, and the
// user dropping the slot may not.
func TestDropSlotOnManagedServer(t *testing.T) {
	srv := testdb.StartServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgconn.Connect(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := conn.Exec(ctx, `CREATE ROLE rds_replication NOLOGIN; CREATE ROLE app LOGIN`).Close(); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User("app")
	err = DropSlot(ctx, u.String(), "idem_outbox")
	if err == nil || !strings.Contains(err.Error(), "GRANT rds_replication TO app") || strings.Contains(err.Error(), "ALTER ROLE") {
		t.Errorf("DropSlot as a user without replication on RDS: %v", err)
	}
}
