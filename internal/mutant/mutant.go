// Package mutant holds known bugs that the random-kill checker (shopctl
// chaos --random) must catch: each one breaks a guarantee on purpose, so
// that a run of the checker on a build that has it shows that the checker
// sees the break and names it. A checker is trusted only for the bugs it
// has been shown to catch.
//
// Mutants exist only in binaries built with the build tag idemmutant (go
// build -tags idemfault,idemmutant ./cmd/shop). Without the tag, Enabled is
// the constant false and every hook is guarded by it, so the compiler
// removes the hook and its argument: no build that users run can carry
// one. With the tag, the environment variable IDEM_MUTANT chooses one
// mutant, by name, optionally with an argument after '=':
//
//	go build -tags idemfault,idemmutant -o shop-mutant ./cmd/shop
//	IDEM_MUTANT=inbox.skip-dedup=order ./shop-mutant ...
//
// With IDEM_MUTANT unset, a mutant build behaves as any other.
//
// Hooks are written
//
//	if mutant.Enabled && mutant.On(mutant.RelayDropOne) {
//		...
//	}
//
// (the constant first: without the tag, the whole block is gone whatever
// the inliner does, as with internal/fault's Enabled).
package mutant

// Tag is the build tag that compiles mutants in.
const Tag = "idemmutant"

// EnvVar is the environment variable that chooses the mutant.
const EnvVar = "IDEM_MUTANT"

// The mutants, by the guarantee each one breaks. docs/RELIABILITY.md lists
// them with the checker's verdict on each.
const (
	// InboxSkipDedup: the consumer named by the argument (every consumer
	// when there is none) applies an event again when its processed_event
	// marker says it was applied already (G3).
	InboxSkipDedup = "inbox.skip-dedup"
	// InboxAckBeforeCommit: the consumer has every delivery acknowledged,
	// whatever its transaction did: a delivery whose transaction failed or
	// never ran (a pause, a retry) is gone from the broker (G2, G3).
	InboxAckBeforeCommit = "inbox.ack-before-commit"
	// RelayDropOne: the relays' ordered publisher, in each process, leaves
	// out of a Publish call the N-th message it publishes (the argument,
	// default 10) and reports it confirmed (G2).
	RelayDropOne = "relay.drop-one"
	// RelaySwap: the relays' ordered publisher, given two messages of one
	// aggregate at once, publishes the later one first (G4).
	RelaySwap = "relay.swap"
	// CDCSkipVisibility: the CDC relays (PostgreSQL's and MariaDB's)
	// publish a transaction's messages as soon as the log gives its
	// commit, without waiting for the transaction to be visible to other
	// sessions (G13).
	CDCSkipVisibility = "cdc.skip-visibility"
)

// Names lists every mutant.
var Names = []string{InboxSkipDedup, InboxAckBeforeCommit, RelayDropOne, RelaySwap, CDCSkipVisibility}
