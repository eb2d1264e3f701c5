package registry

import (
	"strings"
	"testing"
)

// TestAMQPClusterURL checks that a RabbitMQ URL listing a cluster's nodes
// keeps them all, loses idem's own parameters and keeps the others.
func TestAMQPClusterURL(t *testing.T) {
	raw := "amqp://u:s3cret@h1:5672,h2:5673,[::1]:5674/vh?queue_type=quorum&exchange=ev&heartbeat=5"
	u, err := parseAMQPURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	connURL, exchange, queueType := amqpParams(raw, u)
	if want := "amqp://u:s3cret@h1:5672,h2:5673,[::1]:5674/vh?heartbeat=5"; connURL != want || exchange != "ev" || queueType != "quorum" {
		t.Errorf("amqpParams = %q, %q, %q; want %q, ev, quorum", connURL, exchange, queueType, want)
	}
	_, err = parseAMQPURL("amqp://u:s3cret@h1,,h2/")
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "empty host") {
		t.Errorf("parseAMQPURL with an empty host: %v; want an error naming it, without the password", err)
	}
}
