package testkafka

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestDeadJoinerLeaves: a member that sends its JoinGroup while the group
// rebalances and dies before the answer is made to leave after its
// session timeout, and the live member then consumes every partition. In
// kfake alone, the dead member can keep a partition for good (sessions).
func TestDeadJoinerLeaves(t *testing.T) {
	addr := strings.TrimPrefix(Start(t), "kafka://")
	const topic, group = "orders", "billing"
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	prod, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.AllowAutoTopicCreation(), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	produce := func(value string) {
		t.Helper()
		for p := range int32(2) {
			if err := prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte(value)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce("before")

	live, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(500*time.Millisecond),
		kgo.Balancers(kgo.RangeBalancer())) // eager: a partition goes to the new member in one rebalance)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	// consume waits until the live member got value from both partitions.
	consume := func(value string) {
		t.Helper()
		got := map[int32]bool{}
		for len(got) < 2 {
			fs := live.PollFetches(ctx)
			if ctx.Err() != nil {
				t.Fatalf("%q consumed from partitions %v only", value, got)
			}
			fs.EachRecord(func(r *kgo.Record) {
				if string(r.Value) == value {
					got[r.Partition] = true
				}
			})
		}
	}
	consume("before")

	// A second member joins, which rebalances the group, and dies before
	// the answer: its JoinGroup waits until the live member joins again.
	// The group is then stable with a partition for each.
	joinAndDie(t, addr, group, topic)
	for members := 0; members != 2; {
		req := kmsg.NewPtrDescribeGroupsRequest()
		req.Groups = []string{group}
		resp, err := req.RequestWith(ctx, prod)
		if err != nil {
			t.Fatal(err)
		}
		if g := resp.Groups[0]; g.State == "Stable" {
			members = len(g.Members)
		}
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		live.PollRecords(pctx, 1) // nothing to read: waits for the rebalance
		cancel()
	}
	produce("after")
	consume("after")
}

// joinAndDie joins group as a consumer of topic over a connection of its
// own, and closes the connection once its JoinGroup with a member id is
// sent, before the answer.
func joinAndDie(t *testing.T, addr, group, topic string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	meta := kmsg.NewConsumerMemberMetadata()
	meta.Topics = []string{topic}
	join := kmsg.NewPtrJoinGroupRequest()
	join.Version = 5
	join.Group, join.SessionTimeoutMillis, join.RebalanceTimeoutMillis = group, 6000, 60000
	join.ProtocolType = "consumer"
	join.Protocols = []kmsg.JoinGroupRequestProtocol{{Name: "range", Metadata: meta.AppendTo(nil)}}
	f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("dead"))
	if _, err := conn.Write(f.AppendRequest(nil, join, 1)); err != nil {
		t.Fatal(err)
	}
	var head [8]byte // size, correlation id
	if _, err := io.ReadFull(conn, head[:]); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint32(head[:4])-4)
	if _, err := io.ReadFull(conn, body); err != nil {
		t.Fatal(err)
	}
	resp := kmsg.NewPtrJoinGroupResponse()
	resp.Version = join.Version
	if err := resp.ReadFrom(body); err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != kerr.MemberIDRequired {
		t.Fatalf("first JoinGroup: %v, want MEMBER_ID_REQUIRED", err)
	}
	join.MemberID = resp.MemberID
	if _, err := conn.Write(f.AppendRequest(nil, join, 2)); err != nil {
		t.Fatal(err)
	}
}
