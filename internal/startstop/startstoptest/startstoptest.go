// Package startstoptest checks, in the tests of each long-running service,
// that a Stop during Start is safe, and holds a service's start-up with
// servers that accept connections and never answer.
package startstoptest

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// Service is a long-running service: a relay, a subscriber, a purger...
type Service interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

// wait bounds each step of StopDuringStart: a step that takes longer is a
// hang.
const wait = 30 * time.Second

// StopDuringStart checks that a service stopped while its Start is held
// (connecting, checking) ends cleanly: Stop returns, Start returns (an
// error, or nil and then the service ends), Done (when the service has one)
// is closed, and the service cannot start again. newService returns a new
// service and a channel that is closed (or receives) once Start is held.
// It runs twice: a Stop with time to spare, and a Stop whose context has
// already ended (the work abandoned at once, Stop returning at once).
// Leaks are left to the package's goleak check.
func StopDuringStart(t *testing.T, newService func(t *testing.T) (svc Service, held <-chan struct{})) {
	for _, late := range []bool{false, true} {
		name := "stop"
		if late {
			name = "stop out of time"
		}
		t.Run(name, func(t *testing.T) {
			svc, held := newService(t)
			started := make(chan error, 1)
			startCtx, cancelStart := context.WithTimeout(context.Background(), 2*wait)
			defer cancelStart()
			go func() { started <- svc.Start(startCtx) }()
			returned := false // Start returned: held must be closed already
			select {
			case <-held:
			case err := <-started:
				select {
				case <-held:
				default:
					t.Fatalf("Start returned (%v) before it was held", err)
				}
				t.Logf("Start returned %v", err)
				returned = true
			case <-time.After(wait):
				t.Fatal("Start was not held")
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			if late {
				cancel()
			}
			err := svc.Stop(ctx)
			cancel()
			switch {
			case late && err != nil && !errors.Is(err, context.Canceled):
				t.Fatalf("Stop out of time: %v, want nil or context.Canceled", err)
			case !late && err != nil:
				t.Fatalf("Stop during Start: %v", err)
			}
			if !returned {
				select {
				case err := <-started:
					t.Logf("Start returned %v", err)
				case <-time.After(wait):
					t.Fatal("Start did not return after Stop")
				}
			}
			if d, ok := svc.(interface{ Done() <-chan struct{} }); ok {
				select {
				case <-d.Done():
				case <-time.After(wait):
					t.Fatal("Done not closed after Stop")
				}
			}
			ctx, cancel = context.WithTimeout(context.Background(), wait)
			defer cancel()
			if err := svc.Stop(ctx); err != nil {
				t.Fatalf("second Stop: %v", err)
			}
			if err := svc.Start(ctx); !errors.Is(err, idem.ErrStopped) {
				t.Fatalf("Start after Stop: %v, want idem.ErrStopped", err)
			}
		})
	}
}

// SilentListener returns the address of a TCP listener that accepts
// connections and never writes to them, and a channel closed at its first
// connection: a server that holds a client's handshake. Everything is
// closed at cleanup.
func SilentListener(t testing.TB) (addr string, accepted <-chan struct{}) {
	return serve(t, func(c net.Conn, held func()) {
		held()
		for { // until the client or the cleanup closes it
			if _, err := c.Read(make([]byte, 4096)); err != nil {
				return
			}
		}
	})
}

// SilentNATS returns the URL of a NATS server that answers the handshake
// and the pings, and nothing else: no request gets an answer. The channel
// is closed at the first message a client publishes (a request).
func SilentNATS(t testing.TB) (url string, requested <-chan struct{}) {
	addr, requested := serve(t, func(c net.Conn, held func()) {
		if _, err := c.Write([]byte(`INFO {"server_id":"silent","version":"2.10.0","proto":1,"headers":true,"max_payload":1048576}` + "\r\n")); err != nil {
			return
		}
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			switch {
			case strings.HasPrefix(line, "PING"):
				if _, err := c.Write([]byte("PONG\r\n")); err != nil {
					return
				}
			case strings.HasPrefix(line, "PUB ") || strings.HasPrefix(line, "HPUB "):
				held()
			}
		}
	})
	return "nats://" + addr, requested
}

// serve runs a TCP server on 127.0.0.1 that hands each connection to
// handle, with a function closing the returned channel (once).
func serve(t testing.TB, handle func(c net.Conn, held func())) (string, <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{})
	var once sync.Once
	held := func() { once.Do(func() { close(ch) }) }
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				_ = c.Close()
				return
			}
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { handle(c, held) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String(), ch
}

// StopRacesStart calls Start and Stop on svc at once, from two goroutines,
// for a service whose Start does not wait for anything: both return (Start
// with nil or idem.ErrStopped, Stop with nil), Done (when the service has
// one) is closed, and the service cannot start again.
func StopRacesStart(t *testing.T, svc Service) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := svc.Start(ctx); err != nil && !errors.Is(err, idem.ErrStopped) {
			t.Errorf("Start: %v, want nil or idem.ErrStopped", err)
		}
	})
	wg.Go(func() {
		if err := svc.Stop(ctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	wg.Wait()
	if d, ok := svc.(interface{ Done() <-chan struct{} }); ok {
		select {
		case <-d.Done():
		default:
			t.Error("Done not closed after Stop returned")
		}
	}
	if err := svc.Start(ctx); !errors.Is(err, idem.ErrStopped) {
		t.Errorf("Start after Stop: %v, want idem.ErrStopped", err)
	}
}
