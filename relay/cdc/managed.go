package cdc

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// managedServer is the service that runs the PostgreSQL server, as far as
// the start-up check can tell: its settings are changed through that
// service's console or API, and its start-up errors say so instead of
// naming postgresql.conf or pg_hba.conf.
type managedServer int

const (
	selfHosted managedServer = iota
	rds                      // Amazon RDS for PostgreSQL
	aurora                   // Amazon Aurora PostgreSQL
	cloudSQL                 // Google Cloud SQL for PostgreSQL
	azure                    // Azure Database for PostgreSQL
)

// serverSigns are what tells a managed server apart: RDS and Aurora have
// the roles rds_superuser and rds_replication and settings named rds.*,
// Aurora the function aurora_version(); Cloud SQL's flags are settings
// named cloudsql.*; Azure's are named azure.*, with the role
// azure_pg_admin.
type serverSigns struct {
	rdsRoles, rdsSettings, auroraVersion, cloudSQLSettings, azureSettings bool
}

// signsSQL reads serverSigns from catalogs every role may read.
const signsSQL = `SELECT
    EXISTS (SELECT 1 FROM pg_roles WHERE rolname IN ('rds_superuser', 'rds_replication')),
    EXISTS (SELECT 1 FROM pg_settings WHERE name LIKE 'rds.%'),
    EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'aurora_version'),
    EXISTS (SELECT 1 FROM pg_settings WHERE name LIKE 'cloudsql.%'),
    EXISTS (SELECT 1 FROM pg_settings WHERE name LIKE 'azure.%')
        OR EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'azure_pg_admin')`

// readSigns reads the server's signs through q (a pool or a connection).
// A server that does not answer is taken as self-hosted: the signs only
// choose the texts of the errors.
func readSigns(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}) serverSigns {
	var s serverSigns
	if err := q.QueryRow(ctx, signsSQL).Scan(&s.rdsRoles, &s.rdsSettings, &s.auroraVersion, &s.cloudSQLSettings, &s.azureSettings); err != nil {
		return serverSigns{}
	}
	return s
}

// detect tells the service from its signs.
func (s serverSigns) detect() managedServer {
	switch {
	case s.auroraVersion:
		return aurora
	case s.rdsRoles || s.rdsSettings:
		return rds
	case s.cloudSQLSettings:
		return cloudSQL
	case s.azureSettings:
		return azure
	}
	return selfHosted
}

// set says how to give the setting name the value value on m, a setting
// that needs a restart.
func (m managedServer) set(name, value string) string {
	switch m {
	case rds:
		return fmt.Sprintf("on Amazon RDS set %s = %s in the instance's DB parameter group and reboot the instance", name, value)
	case aurora:
		return fmt.Sprintf("on Aurora PostgreSQL set %s = %s in the DB cluster parameter group and reboot the writer instance", name, value)
	case cloudSQL:
		return fmt.Sprintf("on Cloud SQL set the database flag %s=%s (gcloud sql instances patch INSTANCE --database-flags=%s=%s), which restarts the instance", name, value, name, value)
	case azure:
		return fmt.Sprintf("on Azure set the server parameter %s = %s (az postgres flexible-server parameter set --name %s --value %s) and restart the server", name, value, name, value)
	}
	return fmt.Sprintf("set %s = %s in postgresql.conf (or run ALTER SYSTEM SET %s = %s) and restart the server", name, value, name, value)
}

// walLevelHint says how to get wal_level = logical.
func (m managedServer) walLevelHint() string {
	switch m {
	case rds, aurora:
		return m.set("rds.logical_replication", "1") + " (it sets wal_level = logical)"
	case cloudSQL:
		return m.set("cloudsql.logical_decoding", "on")
	case azure:
		return m.set("wal_level", "logical") + " (on a single server, azure.replication_support = logical)"
	}
	return m.set("wal_level", "logical")
}

// slotsHint says how to get more replication slots.
func (m managedServer) slotsHint() string {
	if m == selfHosted {
		return "raise max_replication_slots in postgresql.conf and restart the server"
	}
	return m.set("max_replication_slots", "a larger value")
}

// replicationHint says how the relay's role gets to replicate.
func (m managedServer) replicationHint(user string) string {
	switch m {
	case rds, aurora:
		return fmt.Sprintf("on %s the relay's role needs the rds_replication role (%s gives no REPLICATION attribute): GRANT rds_replication TO %s (as the master user)", m, m, user)
	case cloudSQL:
		return fmt.Sprintf("the relay's role needs the REPLICATION attribute: ALTER ROLE %s WITH REPLICATION, as a member of cloudsqlsuperuser (the postgres user)", user)
	case azure:
		return fmt.Sprintf("the relay's role needs the REPLICATION attribute: ALTER ROLE %s WITH REPLICATION, as the server's administrator (a member of azure_pg_admin)", user)
	}
	return fmt.Sprintf("the relay's role needs the REPLICATION attribute (ALTER ROLE %s REPLICATION)", user)
}

// hbaHint explains a replication connection refused at authentication.
func (m managedServer) hbaHint(user string) string {
	switch m {
	case rds, aurora:
		return fmt.Sprintf("%s lets members of rds_replication open replication connections: GRANT rds_replication TO %s (as the master user), and check the instance's security group", m, user)
	case cloudSQL, azure:
		return fmt.Sprintf("%s has no pg_hba.conf to edit: give %s the REPLICATION attribute (%s), and check that the relay's address may connect (%s)", m, user, m.replicationHint(user), m.network())
	}
	return fmt.Sprintf("pg_hba.conf needs a line for replication connections of %s to this database (a line for \"all\" databases covers them; one for \"replication\" does not)", user)
}

// network names what lets an address connect to m.
func (m managedServer) network() string {
	if m == cloudSQL {
		return "the instance's authorized networks, or the Cloud SQL Auth Proxy"
	}
	return "the server's firewall rules or private access"
}

// String names the service in the errors.
func (m managedServer) String() string {
	return [...]string{"a self-hosted server", "Amazon RDS", "Aurora PostgreSQL", "Cloud SQL", "Azure Database for PostgreSQL"}[m]
}
