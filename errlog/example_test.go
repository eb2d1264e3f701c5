package errlog_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/idem-go/idem/errlog"
)

// A handler whose database is away: each request fails, and the log has
// one line for the outage, then one when requests succeed again.
func Example() {
	// Times vary from run to run: the example's handler leaves them out.
	log := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "failed_for" {
				return slog.Attr{}
			}
			return a
		},
	}))
	errs := errlog.New(log, "order requests", errlog.Config{})

	var dbErr error // what the database says
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if dbErr != nil {
			errs.Error(r.Context(), "request failed", dbErr, "path", r.URL.Path)
			http.Error(w, "internal error; the request may be retried", http.StatusInternalServerError)
			return
		}
		errs.OK(r.Context())
		fmt.Fprintln(w, "ok")
	})
	get := func(path string) int {
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w.Code
	}

	get("/orders/1") // nothing failed: nothing logged
	dbErr = errors.New("dial tcp 10.0.0.7:5432: connect: connection refused")
	for i := range 100 {
		get(fmt.Sprintf("/orders/%d", i))
	}
	dbErr = nil
	fmt.Println(get("/orders/1"))
	errs.OK(context.Background()) // logs nothing: recovered already
	// Output:
	// level=ERROR msg="request failed" path=/orders/0 error="dial tcp 10.0.0.7:5432: connect: connection refused"
	// level=INFO msg="order requests recovered" failures=100
	// 200
}
