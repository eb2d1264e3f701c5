package sqlite_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/driver/sqlite"
	"github.com/idem-go/idem/migrate"
)

func TestPath(t *testing.T) {
	for url, want := range map[string]string{
		"sqlite:app.db":                 "app.db",
		"sqlite:/var/lib/app.db":        "/var/lib/app.db",
		"sqlite:///var/lib/app.db":      "/var/lib/app.db",
		"sqlite://data/app.db":          "data/app.db",
		"SQLITE:app.db":                 "app.db",
		"file:app.db?_pragma=foo(1)":    "file:app.db?_pragma=foo(1)",
		"FILE:/abs/app.db":              "FILE:/abs/app.db",
		"sqlite:":                       "",
		"sqlite:app.db?_time_format=xx": "app.db?_time_format=xx",
	} {
		if got := sqlite.Path(url); got != want {
			t.Errorf("Path(%q) = %q, want %q", url, got, want)
		}
	}
}

func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	for _, url := range []string{
		"sqlite:" + filepath.Join(dir, "a.db"),
		"sqlite://" + filepath.Join(dir, "b.db"),
		"file:" + filepath.Join(dir, "c.db") + "?_pragma=busy_timeout(5000)",
	} {
		d, err := sqlite.OpenURL(ctx, url, sqlite.URLOptions{MaxConns: 3})
		if err != nil {
			t.Fatalf("OpenURL(%q): %v", url, err)
		}
		if n := d.DB().Stats().MaxOpenConnections; n != 3 {
			t.Errorf("%s: %d connections at most, want 3", url, n)
		}
		_ = d.DB().Close()
	}
	for _, c := range []struct {
		url  string
		o    sqlite.URLOptions
		want string
	}{
		{"sqlite:", sqlite.URLOptions{}, "want sqlite:FILE"},
		{"file:", sqlite.URLOptions{}, "want sqlite:FILE"},
		{"sqlite:" + filepath.Join(dir, "d.db"), sqlite.URLOptions{Tables: idem.Tables{Schema: "x"}}, "idem: sqlite: "},
		{"sqlite:" + filepath.Join(dir, "missing", "e.db"), sqlite.URLOptions{}, "idem: sqlite: open "},
	} {
		d, err := sqlite.OpenURL(ctx, c.url, c.o)
		if err == nil {
			_ = d.DB().Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("OpenURL(%q, %+v): %v; want an error with %q", c.url, c.o, err, c.want)
		}
	}
}

// A sqlite: URL, as the idem command takes it, opens the database file and
// gives the driver the outbox, relays and consumers use.
func ExampleOpenURL() {
	dir, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	d, err := sqlite.OpenURL(ctx, "sqlite:"+filepath.Join(dir, "app.db"), sqlite.URLOptions{MaxConns: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer d.DB().Close()
	if _, err := migrate.New(d).Up(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(d.Dialect().Name())
	// Output:
	// sqlite
}
