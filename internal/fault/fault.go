// Package fault implements named fault points: places in idem's code where a
// test can make the process kill itself (SIGKILL, no cleanup, no deferred
// code), to check what survives a crash at exactly that moment.
//
// Fault points exist only in binaries built with the build tag idemfault
// (go build -tags idemfault, go test -tags idemfault; make test passes it).
// Without the tag, Point is an empty function that the compiler inlines
// away and IDEM_FAULT is never read: a production build cannot be made to
// kill itself.
//
// With the tag, a point is armed by the environment variable IDEM_FAULT, a
// comma-separated list of point names, each optionally followed by @N to
// fire on the N-th hit only (default: the first):
//
//	go build -tags idemfault -o idem ./cmd/idem
//	IDEM_FAULT=relay.after-publish-before-mark@3 ./idem relay ...
//
// Unarmed points then cost one atomic load.
//
// In a generic function, guard the call with the constant Enabled:
//
//	if fault.Enabled {
//		fault.Point(fault.RelayAfterClaim)
//	}
//
// The compiler does not always inline calls made by a generic function
// instantiated in another package (the relay's, instantiated by the
// commands), so without the guard an empty call, and its argument, stay in
// the binary; with it, the code is gone whatever the inliner does.
package fault

// Tag is the build tag that compiles fault points in.
const Tag = "idemfault"

// EnvVar is the environment variable that arms fault points.
const EnvVar = "IDEM_FAULT"

// The fault points of idem and of the shop, by where they are hit.
// docs/ARCHITECTURE.md lists them (a test checks it); add a new one here and
// there.
const (
	// OrderBeforeCommit: the shop's order service, just before an order's
	// transaction commits: a process killed there leaves no order and no
	// event.
	OrderBeforeCommit = "order.before-commit"
	// ShippingBeforeCommit: the shop's shipping preparation consumer, its
	// handlers done, its transaction (effects and processed_event marker)
	// not committed.
	ShippingBeforeCommit = "shipping.before-commit"
	// RelayAfterClaim: the relay, after it claimed a batch and before it
	// publishes: the rows are leased to a dead owner until the lease
	// expires.
	RelayAfterClaim = "relay.after-claim"
	// RelayAfterPublishBeforeMark: the relay, after the broker confirmed a
	// batch and before the rows are marked published: they are published
	// again.
	RelayAfterPublishBeforeMark = "relay.after-publish-before-mark"
	// RelayAfterMark: the relay, after it marked a batch published.
	RelayAfterMark = "relay.after-mark"
	// CDCAfterReceive: the CDC relays (relay/cdc, relay/binlog), a
	// transaction's events received from the log (its commit read), nothing
	// of it published: the slot, or the stored binlog position, gives the
	// transaction again.
	CDCAfterReceive = "cdc.after-receive"
	// CDCAfterPublishBeforeConfirm: the CDC relays, after the broker
	// confirmed every message up to a transaction's commit, before that
	// position is confirmed to the server (or stored, for the binlog
	// relay): they are published again.
	CDCAfterPublishBeforeConfirm = "cdc.after-publish-before-confirm"
	// CDCAfterConfirm: the CDC relays, after a position was confirmed to
	// the server (standby status update sent), or stored in the binlog
	// relay's position table.
	CDCAfterConfirm = "cdc.after-confirm"
	// InboxAfterCommitBeforeAck: the RabbitMQ subscriber, and the NATS and
	// Kafka subscribers the commands open (internal/registry), after the
	// consumer committed a batch and before it is acknowledged: the broker
	// delivers the messages again. The shop's crash table uses this one
	// name on every broker.
	InboxAfterCommitBeforeAck = "inbox.after-commit-before-ack"
	// KafkaAfterHandleBeforeCommit: the Kafka subscriber, after the
	// consumer's transaction committed and before the offsets are
	// committed.
	KafkaAfterHandleBeforeCommit = "kafka.after-handle-before-commit"
	// NATSAfterHandleBeforeAck: the NATS subscriber, after the consumer
	// returned its dispositions for a batch and before the messages are
	// acknowledged.
	NATSAfterHandleBeforeAck = "nats.after-handle-before-ack"
)

// Points lists every fault point.
var Points = []string{
	OrderBeforeCommit,
	ShippingBeforeCommit,
	RelayAfterClaim,
	RelayAfterPublishBeforeMark,
	RelayAfterMark,
	CDCAfterReceive,
	CDCAfterPublishBeforeConfirm,
	CDCAfterConfirm,
	InboxAfterCommitBeforeAck,
	KafkaAfterHandleBeforeCommit,
	NATSAfterHandleBeforeAck,
}

// RequireEnabled fails t at once when fault points are compiled out: a test
// that waits for a process to kill itself at a point would otherwise wait
// for nothing, or pass without the crash it is about.
func RequireEnabled(t interface {
	Helper()
	Fatalf(format string, args ...any)
}) {
	t.Helper()
	if !Enabled {
		t.Fatalf("fault points are compiled out: this test kills processes at them; run it with -tags %s (make test does)", Tag)
	}
}
