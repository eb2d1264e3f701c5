package amqp

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSplitURL(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"amqp://guest:guest@localhost:5672/", []string{"amqp://guest:guest@localhost:5672/"}},
		{"amqp://u:p@h1:5672,h2:5673,h3/v?heartbeat=5", []string{
			"amqp://u:p@h1:5672/v?heartbeat=5", "amqp://u:p@h2:5673/v?heartbeat=5", "amqp://u:p@h3/v?heartbeat=5"}},
		{"amqps://u:p,w@[::1]:5671,[::2]:5671", []string{"amqps://u:p,w@[::1]:5671", "amqps://u:p,w@[::2]:5671"}},
		{"amqp://h1, h2/", []string{"amqp://h1/", "amqp://h2/"}},
	} {
		got, err := SplitURL(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("SplitURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "localhost:5672", "http://u:s3cret@h/", "amqp://u:s3cret@h1,,h2/", "amqp://u:s3cret@/", "amqp://u:s3cret@h1:x,h2/"} {
		_, err := SplitURL(in)
		if err == nil {
			t.Errorf("SplitURL(%q) = nil error", in)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("SplitURL(%q) = %v: shows the password", in, err)
		}
	}
}

func TestHostRingStartsAfterTheLostHost(t *testing.T) {
	var r hostRing
	if k := r.start(3); k != 0 {
		t.Fatalf("first start = %d, want 0", k)
	}
	if prev := r.connected(0); prev != -1 {
		t.Fatalf("connected(0) = %d, want -1", prev)
	}
	if k := r.start(3); k != 1 {
		t.Fatalf("start after host 0 = %d, want 1", k)
	}
	r.connected(2)
	if k := r.start(3); k != 0 {
		t.Fatalf("start after host 2 = %d, want 0", k)
	}
}

// TestDialFailsOverAndRedacts dials a URL whose hosts refuse connections or
// never answer the AMQP handshake: every host is tried, from the host after
// the last one, and the error names each without the password.
func TestDialFailsOverAndRedacts(t *testing.T) {
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := refused.Addr().String()
	refused.Close()
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never speaks
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	cfg := ConnConfig{URL: "amqp://u:s3cret@" + refusedAddr + "," + silent.Addr().String() + "/", DialTimeout: 200 * time.Millisecond}.withDefaults()
	_, err = cfg.dial(context.Background())
	if err == nil {
		t.Fatal("dial succeeded")
	}
	msg := err.Error()
	if strings.Contains(msg, "s3cret") || !strings.Contains(msg, refusedAddr) || !strings.Contains(msg, silent.Addr().String()) || !strings.Contains(msg, "u:xxxxx@") {
		t.Fatalf("dial error %q: want both hosts, the password redacted", msg)
	}
}
