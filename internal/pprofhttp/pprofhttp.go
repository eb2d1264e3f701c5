// Package pprofhttp serves the Go runtime's profiles (net/http/pprof) on a
// mux of the caller's, for the admin addresses of idem relay and the shop.
// (Importing net/http/pprof also registers them on http.DefaultServeMux,
// which idem never serves.)
package pprofhttp

import (
	"net/http"
	"net/http/pprof"
)

// Register serves /debug/pprof/ on mux: the index, the named profiles
// (heap, goroutine, allocs, block, mutex, threadcreate), and cmdline,
// profile (CPU, ?seconds=N), symbol and trace.
func Register(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
