// Package batch groups the messages a subscriber receives into per-worker
// batches, so that one consumer transaction covers many messages while the
// messages of one key stay with one worker, in order.
package batch

import (
	"sync"
	"time"
)

// Dispatch reads items from in until it is closed and hands them to workers
// goroutines in batches: each item goes to worker pick(item) (in
// [0, workers)); a worker's batch is sent to it when it holds size items or
// when its first item has waited linger. Each worker runs work(i, batches)
// on its own channel of batches, which it must read until it is closed (a
// worker that stops reading holds every worker back: that is how a paused
// consumer stops fetching). When in is closed, the batches still pending
// are sent, the channels closed, and Dispatch returns once every work has
// returned.
func Dispatch[T any](in <-chan T, workers, size int, linger time.Duration, pick func(T) int, work func(worker int, batches <-chan []T)) {
	queues := make([]chan []T, workers)
	var wg sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan []T, 1)
		wg.Go(func() { work(i, queues[i]) })
	}
	pending := make([][]T, workers)
	since := make([]time.Time, workers)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	armed := false
	flush := func(i int) {
		queues[i] <- pending[i]
		pending[i] = nil
	}
	for {
		select {
		case item, ok := <-in:
			if !ok {
				timer.Stop()
				for i := range pending {
					if len(pending[i]) > 0 {
						flush(i)
					}
					close(queues[i])
				}
				wg.Wait()
				return
			}
			i := pick(item)
			pending[i] = append(pending[i], item)
			if len(pending[i]) >= size {
				flush(i)
			} else if len(pending[i]) == 1 {
				since[i] = time.Now()
				if !armed {
					timer.Reset(linger)
					armed = true
				}
			}
		case <-timer.C:
			armed = false
			now := time.Now()
			var next time.Duration
			for i := range pending {
				if len(pending[i]) == 0 {
					continue
				}
				if wait := linger - now.Sub(since[i]); wait > 0 {
					if next == 0 || wait < next {
						next = wait
					}
					continue
				}
				flush(i)
			}
			if next > 0 {
				timer.Reset(next)
				armed = true
			}
		}
	}
}
