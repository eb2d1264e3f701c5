package netaddr_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/internal/netaddr"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Only loopback addresses pass; an empty host listens everywhere.
func TestIsLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9464": true, "localhost:9464": true, "[::1]:9464": true, "127.0.0.2:1": true,
		":9464": false, "0.0.0.0:9464": false, "192.168.1.4:9464": false, "example.com:80": false, "junk": false,
	} {
		if got := netaddr.IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
