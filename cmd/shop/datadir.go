package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/idem-go/idem/broker/nats/embedded"
	"github.com/idem-go/idem/internal/dirlock"
)

// checkDataDir refuses, before anything is opened, to run the embedded
// broker on a store directory another process's embedded broker holds (a
// shop, or shop broker, on the same --data-dir): two servers on one
// JetStream store corrupt it, and two shops there would both claim every
// consumer. The server takes the lock itself when it starts and holds it
// for the process's life; this check makes the refusal come at once, with
// the flag to change.
func checkDataDir(cfg runConfig) error {
	dir, ok := embeddedDir(cfg.Broker)
	if !ok {
		return nil
	}
	err := embedded.CheckDir(dir)
	var held *dirlock.HeldError
	if !errors.As(err, &held) {
		return err
	}
	holder := "another process"
	if held.PID != 0 {
		holder = fmt.Sprintf("process %d", held.PID)
	}
	if cfg.DataDir != "" && cfg.Broker == embeddedBrokerURL(filepath.Join(cfg.DataDir, "nats")) {
		return fmt.Errorf("the data directory %s is in use by %s, a shop or shop broker running the embedded broker there (lock file %s): stop it, or give this shop another --data-dir",
			cfg.DataDir, holder, held.Path)
	}
	return fmt.Errorf("the embedded broker's directory %s (--broker) is in use by %s (lock file %s): stop it, or give this shop another directory", dir, holder, held.Path)
}
