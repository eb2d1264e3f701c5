package testkafka

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// sessions ends the group sessions of consumers that died, as a Kafka
// broker does after their session timeout, where kfake does not.
//
// kfake starts a member's session timer when it answers the member's
// JoinGroup. When the member's process died while its JoinGroup waited
// for a rebalance, the answer cannot be sent and no timer starts; the
// leader's SyncGroup then clears the timer of the members that never
// synced. The dead member keeps its partitions in every later generation,
// and nobody consumes them: a consumer killed while it joined a group
// stops the group's consumption of its partitions for good.
//
// sessions sees every request of a group member (kfake's control
// functions, which leave the requests to kfake), and every second asks
// kfake for the state of its groups. A member that sent nothing for
// longer than its session timeout, and a second more, is made to leave
// the group (LeaveGroup with its member id, as an administrator would),
// which rebalances the group as the broker's session timeout would have.
// A JoinGroup parked while the group prepares a rebalance, and a SyncGroup
// parked while it completes one, keep their member alive, as in Kafka;
// their time counts from when the watch first sees them answered.
type sessions struct {
	mu     sync.Mutex
	last   map[member]seen
	synced map[string]time.Time // by group: its latest SyncGroup
}

type member struct{ group, id string }

type seen struct {
	at       time.Time
	timeout  time.Duration
	key      kmsg.Key  // the request's
	answered time.Time // when the watch saw the group past a parked request
}

// watchSessions starts ending the dead members' sessions of c's groups,
// until stop is closed.
func watchSessions(c *kfake.Cluster, stop <-chan struct{}) error {
	s := &sessions{last: map[member]seen{}, synced: map[string]time.Time{}}
	observe := func(key kmsg.Key, f func(kmsg.Request) (group, id string, timeout int32)) {
		c.ControlKey(int16(key), func(r kmsg.Request) (kmsg.Response, error, bool) {
			group, id, timeout := f(r)
			s.touch(group, id, key, time.Duration(timeout)*time.Millisecond)
			return nil, nil, false
		})
	}
	observe(kmsg.JoinGroup, func(r kmsg.Request) (string, string, int32) {
		req := r.(*kmsg.JoinGroupRequest)
		return req.Group, req.MemberID, req.SessionTimeoutMillis
	})
	observe(kmsg.SyncGroup, func(r kmsg.Request) (string, string, int32) {
		req := r.(*kmsg.SyncGroupRequest)
		return req.Group, req.MemberID, 0
	})
	observe(kmsg.Heartbeat, func(r kmsg.Request) (string, string, int32) {
		req := r.(*kmsg.HeartbeatRequest)
		return req.Group, req.MemberID, 0
	})
	observe(kmsg.OffsetCommit, func(r kmsg.Request) (string, string, int32) {
		req := r.(*kmsg.OffsetCommitRequest)
		return req.Group, req.MemberID, 0
	})
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		return err
	}
	go func() {
		defer cl.Close()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				s.expire(cl)
			}
		}
	}()
	return nil
}

// touch records a request of member id of group; timeout is its session
// timeout when the request gives it.
func (s *sessions) touch(group, id string, key kmsg.Key, timeout time.Duration) {
	if id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := member{group, id}
	if key == kmsg.SyncGroup {
		s.synced[group] = time.Now()
	}
	if timeout == 0 {
		timeout = s.last[k].timeout
	}
	s.last[k] = seen{at: time.Now(), timeout: timeout, key: key}
}

// expire makes the members past their session timeout leave.
func (s *sessions) expire(cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.mu.Lock()
	groups := map[string]bool{}
	for k := range s.last {
		groups[k.group] = true
	}
	s.mu.Unlock()
	if len(groups) == 0 {
		return
	}
	req := kmsg.NewPtrDescribeGroupsRequest()
	for g := range groups {
		req.Groups = append(req.Groups, g)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return
	}
	now := time.Now()
	for _, g := range resp.Groups {
		var dead []kmsg.LeaveGroupRequestMember
		s.mu.Lock()
		for _, m := range g.Members {
			k := member{g.Group, m.MemberID}
			last, ok := s.last[k]
			if !ok {
				// Joined before the watch began: its time starts now.
				s.last[k] = seen{at: now}
				continue
			}
			// A JoinGroup is answered once a member of the group synced
			// after it: one of a dead member stays the last request of a
			// member in the next rebalance too.
			parkable := last.key == kmsg.JoinGroup || last.key == kmsg.SyncGroup
			switch {
			case last.key == kmsg.JoinGroup && g.State == "PreparingRebalance" && !s.synced[g.Group].After(last.at),
				last.key == kmsg.SyncGroup && g.State == "CompletingRebalance":
				last.answered = time.Time{} // parked: alive
				s.last[k] = last
				continue
			case parkable && last.answered.IsZero():
				last.answered = now
				s.last[k] = last
				continue
			}
			from := last.at
			if parkable && last.answered.After(from) {
				from = last.answered
			}
			if last.timeout > 0 && now.Sub(from) > last.timeout+time.Second {
				dead = append(dead, kmsg.LeaveGroupRequestMember{MemberID: m.MemberID})
				delete(s.last, k)
				fmt.Fprintf(os.Stderr, "testkafka: group %s (%s): member %s sent nothing for %v (its session timeout: %v; last request: %s); made to leave\n",
					g.Group, g.State, m.MemberID, now.Sub(from).Round(time.Millisecond), last.timeout, kmsg.NameForKey(int16(last.key)))
			}
		}
		s.mu.Unlock()
		if len(dead) > 0 {
			leave := kmsg.NewPtrLeaveGroupRequest()
			leave.Group, leave.Members = g.Group, dead
			_, _ = leave.RequestWith(ctx, cl)
		}
	}
}
