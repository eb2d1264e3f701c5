package binlog

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// managedServer is the service that runs the server, as far as the start-up
// check can tell: its settings are changed through that service's console
// or API, not the server's configuration file, and its start-up errors say
// so.
type managedServer int

const (
	selfHosted managedServer = iota
	rds                      // Amazon RDS for MariaDB or MySQL
	aurora                   // Amazon Aurora MySQL
	cloudSQL                 // Google Cloud SQL for MySQL
	azure                    // Azure Database for MySQL or MariaDB
)

// serverSigns are the server's variables that tell a managed server apart:
// RDS installs its binaries under /rdsdbbin/, Aurora has aurora_version,
// Cloud SQL's flags are variables named cloudsql_*, Azure's server
// parameters include aad_auth_* (Microsoft Entra authentication).
type serverSigns struct {
	basedir        string
	versionComment string
	// names are the names of the server's variables that start with
	// aurora_, cloudsql_ or aad_auth_, lower-cased.
	names []string
}

// signsSQL reads serverSigns: SHOW VARIABLES, which MariaDB and MySQL 8
// both have (MySQL has no information_schema.GLOBAL_VARIABLES).
const signsSQL = `SHOW GLOBAL VARIABLES WHERE Variable_name IN ('basedir', 'version_comment')
    OR Variable_name LIKE 'aurora\_%' OR Variable_name LIKE 'cloudsql\_%' OR Variable_name LIKE 'aad\_auth\_%'`

// readSigns reads the server's signs. A server that does not answer is
// taken as self-hosted: the signs only choose the texts of the errors.
func readSigns(ctx context.Context, db *sql.DB) serverSigns {
	var s serverSigns
	rows, err := db.QueryContext(ctx, signsSQL)
	if err != nil {
		return s
	}
	defer rows.Close()
	for rows.Next() {
		var name, value string
		if rows.Scan(&name, &value) != nil {
			return serverSigns{}
		}
		switch name = strings.ToLower(name); name {
		case "basedir":
			s.basedir = value
		case "version_comment":
			s.versionComment = value
		default:
			s.names = append(s.names, name)
		}
	}
	return s
}

// detect tells the service from its signs.
func (s serverSigns) detect() managedServer {
	has := func(prefix string) bool {
		for _, n := range s.names {
			if strings.HasPrefix(n, prefix) {
				return true
			}
		}
		return false
	}
	switch {
	case has("aurora_"):
		return aurora
	case strings.HasPrefix(s.basedir, "/rdsdbbin/"), strings.Contains(strings.ToLower(s.versionComment), "amazon rds"):
		return rds
	case has("cloudsql_"):
		return cloudSQL
	case has("aad_auth_"):
		return azure
	}
	return selfHosted
}

// String names the service in the errors.
func (m managedServer) String() string {
	return [...]string{"a self-hosted server", "Amazon RDS", "Aurora MySQL", "Cloud SQL", "Azure Database for MySQL/MariaDB"}[m]
}

// set says how to give the server variable name the value value on m.
// dynamic says whether the variable can change without a restart.
func (m managedServer) set(name, value string, dynamic bool) string {
	switch m {
	case rds:
		s := fmt.Sprintf("on Amazon RDS set %s = %s in the instance's DB parameter group", name, value)
		if !dynamic {
			s += " and reboot the instance"
		}
		return s
	case aurora:
		return fmt.Sprintf("on Aurora MySQL set %s = %s in the DB cluster parameter group and reboot the writer instance", name, value)
	case cloudSQL:
		return fmt.Sprintf("on Cloud SQL set the database flag %s=%s (gcloud sql instances patch INSTANCE --database-flags=%s=%s; it may restart the instance)", name, value, name, value)
	case azure:
		return fmt.Sprintf("on Azure set the server parameter %s = %s (az mysql flexible-server parameter set --name %s --value %s)", name, value, name, value)
	}
	s := fmt.Sprintf("SET GLOBAL %s = '%s' and %s = %s in the [mysqld] section of the server's configuration", name, value, name, value)
	if !dynamic {
		s = fmt.Sprintf("set %s = %s in the [mysqld] section of the server's configuration, then restart it", name, value)
	}
	return s
}

// logBinHint says how to turn the binary log on.
func (m managedServer) logBinHint() string {
	switch m {
	case rds:
		return "on Amazon RDS the binary log is on when automated backups are (a backup retention period of 1 day or more)"
	case aurora:
		return m.set("binlog_format", "ROW", false) + ", which turns the binary log on"
	case cloudSQL:
		return "on Cloud SQL turn point-in-time recovery on (gcloud sql instances patch INSTANCE --enable-bin-log)"
	case azure:
		return "on Azure the binary log is always on: check that the URL names the primary server, not a read replica"
	}
	return "add log_bin = mariadb-bin and server_id = 1 (any number unique in the topology) to the [mysqld] section of the server's configuration, then restart it"
}

// grantHint says who runs the GRANT of privileges on m.
func (m managedServer) grantHint() string {
	switch m {
	case rds, aurora:
		return " (as the instance's master user)"
	case cloudSQL:
		return " (as a user with cloudsqlsuperuser, root by default)"
	case azure:
		return " (as the server's administrator login)"
	}
	return ""
}
