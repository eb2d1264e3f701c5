package main

import "github.com/idem-go/idem/internal/fault"

// faultHook returns the hook of a shop service (order.Config.BeforeCommit,
// shipping.Config.BeforeCommit) that hits the fault point name: nil unless
// fault points are compiled in (build tag idemfault), so that a production
// shop has no hook at all.
func faultHook(name string) func() {
	if !fault.Enabled {
		return nil
	}
	return func() { fault.Point(name) }
}
