package dashboard_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/dashboard"
	"github.com/idem-go/idem/driver/postgres"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/monitor"
)

// A service mounts the dashboard on its admin address, over its database.
// Here a message the stock consumer could not decode is in its failure
// store: the dashboard lists it, and shows it byte for byte.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db := postgres.NewPgx(pool)

	// What a consumer does with a message it cannot decode.
	id, err := inbox.NewFailureStore(db).Save(ctx, idem.FailedMessage{
		Consumer: "stock", Source: "stock.events", EventID: uuid.Nil,
		Body: []byte("not json"), Error: "undecodable: invalid character 'o'", Attempts: 1,
	})
	if err != nil {
		log.Fatal(err)
	}

	d, err := dashboard.New(dashboard.Config{
		Databases: []dashboard.Database{{
			Name:   "stock",
			Store:  db,
			Source: monitor.New(db, monitor.Options{Name: "stock"}),
		}},
		Path:     "/dashboard/",
		ReadOnly: true, // no Redeliverer here: show, do not act
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := d.Start(ctx); err != nil { // samples for the charts
		log.Fatal(err)
	}
	defer d.Stop(context.Background())
	mux := http.NewServeMux()
	mux.Handle("/dashboard/", d)

	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	code, list := get("/dashboard/messages?consumer=stock")
	fmt.Println("list:", code, strings.Contains(list, fmt.Sprintf(`data-id="%d"`, id)))
	code, page := get(fmt.Sprintf("/dashboard/messages/stock/%d", id))
	fmt.Println("message:", code, strings.Contains(page, "not json"), strings.Contains(page, `id="retry"`))
	// Output:
	// list: 200 true
	// message: 200 true false
}
