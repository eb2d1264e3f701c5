package dbopen

import (
	"fmt"
	"strings"

	"github.com/idem-go/idem/driver"
	"github.com/idem-go/idem/driver/mysql"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/driver/sqlite"
)

// DialectNames are the names Dialect accepts, one per dialect.
var DialectNames = []string{"postgres", "mysql", "sqlite"}

// Dialect returns the dialect called name (postgres or postgresql, mysql or
// mariadb, sqlite) bound to tables, without a database: for what needs
// only the SQL, such as printing the migrations.
func Dialect(name string, tables driver.Tables) (driver.Dialect, error) {
	var d driver.Dialect
	var err error
	switch strings.ToLower(name) {
	case "postgres", "postgresql":
		d, err = postgres.NewDialect(tables)
	case "mysql", "mariadb":
		d, err = mysql.NewDialect(tables)
	case "sqlite":
		d, err = sqlite.NewDialect(tables)
	default:
		return nil, fmt.Errorf("dialect %q: want %s", name, strings.Join(DialectNames, ", "))
	}
	if err != nil {
		return nil, err
	}
	return d, nil
}
