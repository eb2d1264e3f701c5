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

// recordApplications says whether the consumers write the application
// ledger (store.DB.RecordApplications), which shopctl chaos reads to find
// an event applied twice, lost or applied out of order: in builds with
// fault points only, the ones shopctl chaos runs.
const recordApplications = fault.Enabled
