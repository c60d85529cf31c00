package hubctl

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// confirmer answers whether networks the cache reads as gone are gone, from
// reads past the cache shared between the collects that ask at about the
// same time: the rule that a network is collected only after a direct read
// says it is gone, at about one request per batch of collects instead of
// one per collect.
//
// An ask is answered only by a read that starts after it: a cache that lags
// and a read that began before a network was re-created could both miss
// it. So one read is in flight at a time, and every ask made meanwhile
// joins the next one, which starts when the one in flight ends and every
// collect in progress has asked (or maxGather has passed): the collects
// answered by one read delete their claims, take their next networks and
// ask again, and a read that started while they were at it would answer a
// few of them and leave the rest for yet another read.
type confirmer struct {
	mu sync.Mutex
	// next is the batch that asks join; it has not started reading.
	next *confirmBatch
	// reading: a goroutine is reading batches; it takes next when its
	// read ends.
	reading bool
	// collecting counts the collects that ask, from their start to their
	// end; changed is told when it falls or an ask joins next.
	collecting int
	changed    chan struct{}
}

// maxGather bounds how long a read waits for the collects in progress to
// ask: a collect held up in its deletes (an API server slow to answer)
// delays the others' confirmation by no more than this.
const maxGather = time.Second

func newConfirmer() confirmer { return confirmer{changed: make(chan struct{}, 1)} }

// tell wakes a gathering read, if one waits; cf.mu is held.
func (cf *confirmer) tell() {
	select {
	case cf.changed <- struct{}{}:
	default:
	}
}

// startCollect and endCollect bracket a collect that asks.
func (c *Controller) startCollect() {
	c.confirm.mu.Lock()
	c.confirm.collecting++
	c.confirm.mu.Unlock()
}

func (c *Controller) endCollect() {
	c.confirm.mu.Lock()
	c.confirm.collecting--
	c.confirm.tell()
	c.confirm.mu.Unlock()
}

// confirmBatch is one read past the cache and the asks it answers.
type confirmBatch struct {
	// ctx is the first asker's, for the read: the collects share the
	// controller's context, and one whose context ended has its batch
	// answered with that error, which only delays the others' collect.
	ctx  context.Context
	keys map[Key]bool
	asks int
	done chan struct{}
	// Set before done is closed:
	live map[Key]bool
	errs map[Key]error // per key, when the batch was read with GETs
	err  error         // the whole batch's, when its LIST failed
}

// confirmGone reports whether key is gone by a read past the cache that
// started after this call. Its error is the read's: the caller collects
// nothing on it.
func (c *Controller) confirmGone(ctx context.Context, key Key) (bool, error) {
	cf := &c.confirm
	cf.mu.Lock()
	if cf.next == nil {
		cf.next = &confirmBatch{ctx: ctx, keys: map[Key]bool{}, done: make(chan struct{})}
	}
	b := cf.next
	b.keys[key] = true
	b.asks++
	cf.tell()
	start := !cf.reading
	cf.reading = true
	cf.mu.Unlock()
	if start {
		go c.readBatches()
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return false, fmt.Errorf("confirm %s is gone: %w", key, ctx.Err())
	}
	if b.err != nil {
		return false, b.err
	}
	if err := b.errs[key]; err != nil {
		return false, err
	}
	return !b.live[key], nil
}

// readBatches reads the waiting batch, then the one that gathered during
// that read, until none waits.
func (c *Controller) readBatches() {
	cf := &c.confirm
	for {
		cf.mu.Lock()
		if cf.next == nil {
			cf.reading = false
			cf.mu.Unlock()
			return
		}
		cf.gather()
		b := cf.next
		cf.next = nil
		cf.mu.Unlock()
		c.readBatch(b)
		close(b.done)
	}
}

// gather waits, cf.mu held, until every collect in progress has asked, or
// maxGather has passed.
func (cf *confirmer) gather() {
	timer := time.NewTimer(maxGather)
	defer timer.Stop()
	for cf.collecting > cf.next.asks {
		cf.mu.Unlock()
		select {
		case <-cf.changed:
		case <-timer.C:
			cf.mu.Lock()
			return
		}
		cf.mu.Lock()
	}
}

// readBatch answers b with one LIST of every network or, when b asks about
// fewer networks than that LIST would take pages (a large hub, few
// collects), with a GET of each: whichever is fewer requests. Both are
// reads past the cache.
func (c *Controller) readBatch(b *confirmBatch) {
	pages := 1 + c.cache.Len()/listPageSize
	b.live = make(map[Key]bool, len(b.keys))
	if len(b.keys) < pages {
		b.errs = make(map[Key]error)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for k := range b.keys {
			wg.Go(func() {
				_, err := c.api.GetNetwork(b.ctx, k.Namespace, k.Name)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					b.live[k] = true
				case !errors.Is(err, ErrNotFound):
					b.errs[k] = fmt.Errorf("read network %s: %w", k, err)
				}
			})
		}
		wg.Wait()
		return
	}
	keys, err := c.api.ListNetworkKeys(b.ctx)
	if err != nil {
		b.err = fmt.Errorf("list networks to confirm %d gone: %w", len(b.keys), err)
		return
	}
	for _, k := range keys {
		if b.keys[k] {
			b.live[k] = true
		}
	}
}
