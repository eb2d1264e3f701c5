package dashboard_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/testdb"
)

func TestMain(m *testing.M) {
	os.Exit(testdb.RunWithExampleDatabase(m,
		// database/sql's connection opener outlives a test until DB.Close.
		func() error { return goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener")) }))
}
