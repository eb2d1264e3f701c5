package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/internal/testamqp"
	"github.com/idem-go/idem/internal/testdb"
)

// TestStatusPartitions: idem status shows the partitions of a consumer
// shared by replicas (inbox.Group): owner, epoch, lease (running, expired,
// free) and, with a broker, the messages waiting in each partition's queue.
func TestStatusPartitions(t *testing.T) {
	t.Parallel()
	pg := testdb.NewPostgres(t)
	pg.Exec(t, `INSERT INTO processed_event (consumer_name, event_id, processed_at) VALUES ('stock', gen_random_uuid(), now())`)
	pg.Exec(t, `INSERT INTO consumer_member (consumer_name, member_id, lease_until) VALUES ('stock', 'host-a', now() + interval '4 seconds')`)
	pg.Exec(t, `INSERT INTO consumer_partition (consumer_name, partition_no, owner, epoch, lease_until)
VALUES ('stock', 0, 'host-a', 3, now() + interval '4 seconds'),
       ('stock', 1, 'host-b', 2, now() - interval '10 seconds'),
       ('stock', 2, NULL, 5, NULL)`)
	amqpURL := testamqp.URL(t)
	prefix := testamqp.Name("idem_t_")
	base := prefix + ".stock.events"
	queues := []string{base + ".p0", base + ".p1", base + ".p2"}
	withAMQPChannel(t, amqpURL, func(ch *amqp091.Channel) {
		for _, q := range queues {
			if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			withAMQPChannel(t, amqpURL, func(ch *amqp091.Channel) {
				for _, q := range queues {
					_, _ = ch.QueueDelete(q, false, false, false)
				}
			})
		})
		for range 2 {
			if err := ch.PublishWithContext(context.Background(), "", queues[1], false, false, amqp091.Publishing{Body: []byte("{}")}); err != nil {
				t.Fatal(err)
			}
		}
	})
	args := []string{"status", "--db", pg.URL, "--broker", amqpURL, "--prefix", prefix}

	code, out, errOut := idem(t, nil, "", args...)
	if code != 0 {
		t.Fatalf("idem status = %d\n%s%s", code, out, errOut)
	}
	q := regexp.QuoteMeta(base)
	for _, re := range []string{
		`\n  CONSUMER +PARTITION +OWNER +EPOCH +LEASE +QUEUE +WAITING\n`,
		`\n  stock +0 +host-a +3 +[1-4]s left +` + q + `\.p0 +0\n`,
		`\n  stock +1 +host-b +2 +expired 1\ds ago +` + q + `\.p1 +2\n`,
		`\n  stock +2 +- +5 +free +` + q + `\.p2 +0\n`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("idem status printed\n%s\nwant a match of %q", out, re)
		}
	}

	code, out, errOut = idem(t, nil, "", append(args, "--json")...)
	if code != 0 {
		t.Fatalf("idem status --json = %d\n%s%s", code, out, errOut)
	}
	var doc struct {
		Partitions []struct {
			Consumer   string   `json:"consumer"`
			Partition  int      `json:"partition"`
			Owner      *string  `json:"owner"`
			Epoch      int64    `json:"epoch"`
			Live       bool     `json:"live"`
			LeaseLeftS *float64 `json:"lease_left_seconds"`
			Broker     *struct {
				Queue string `json:"queue"`
				Ready *int64 `json:"ready"`
			} `json:"broker"`
		} `json:"partitions"`
	}
	if err := json.NewDecoder(strings.NewReader(out)).Decode(&doc); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	if len(doc.Partitions) != 3 {
		t.Fatalf("partitions: %+v, want 3", doc.Partitions)
	}
	p0, p1, p2 := doc.Partitions[0], doc.Partitions[1], doc.Partitions[2]
	if p0.Owner == nil || *p0.Owner != "host-a" || !p0.Live || p0.Epoch != 3 || p0.LeaseLeftS == nil || *p0.LeaseLeftS <= 0 {
		t.Errorf("partition 0: %+v, want host-a's live lease, epoch 3", p0)
	}
	if p1.Owner == nil || *p1.Owner != "host-b" || p1.Live || p1.LeaseLeftS == nil || *p1.LeaseLeftS > -10 {
		t.Errorf("partition 1: %+v, want host-b's lease expired 10s ago", p1)
	}
	if b := p1.Broker; b == nil || b.Queue != base+".p1" || b.Ready == nil || *b.Ready != 2 {
		t.Errorf("partition 1's queue: %+v, want %s.p1 with 2 ready", p1.Broker, base)
	}
	if p2.Owner != nil || p2.Live || p2.LeaseLeftS != nil || p2.Epoch != 5 {
		t.Errorf("partition 2: %+v, want free, epoch 5", p2)
	}
}
