package dbopen

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem"
)

func TestOpenSQLite(t *testing.T) {
	dir := t.TempDir()
	for _, u := range []string{
		"sqlite:" + filepath.Join(dir, "a.db"),
		"sqlite://" + filepath.Join(dir, "b.db"),
		"file:" + filepath.Join(dir, "c.db") + "?_pragma=busy_timeout(5000)",
	} {
		db, err := Open(context.Background(), u, idem.Tables{})
		if err != nil {
			t.Fatalf("open %s: %v", u, err)
		}
		if db.Dialect().Name() != "sqlite" {
			t.Errorf("%s: dialect %s", u, db.Dialect().Name())
		}
		db.Close()
	}
	if _, err := Open(context.Background(), "sqlite:"+filepath.Join(dir, "d.db"), idem.Tables{Schema: "x"}); err == nil {
		t.Error("sqlite with a schema: want an error")
	}
}
