// Package netaddr holds what the commands check of the addresses they
// listen on.
package netaddr

import "net"

// IsLoopback reports whether the host of addr (host:port) is a loopback
// address or "localhost". An empty host listens on every interface: false.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
