package cdc_test

import (
	"net/url"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/testdb"
)

func TestMain(m *testing.M) {
	os.Exit(testdb.RunWithExampleDatabase(exampleRun{m}, func() error { return goleak.Find() }))
}

// exampleRun tells the examples the schema of their database.
type exampleRun struct{ m *testing.M }

func (e exampleRun) Run() int {
	if u, err := url.Parse(os.Getenv("DATABASE_URL")); err == nil {
		os.Setenv("OUTBOX_SCHEMA", u.Query().Get("search_path"))
	}
	return e.m.Run()
}
