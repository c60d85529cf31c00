package reclaim

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/link/driver"
)

// fakeLinks is an in-memory link table for unit tests of the pass logic,
// which sits above the link layer; the privileged tests run the real one.
// onVerify lets a test change the table between a pass's dump and its
// recheck, a race the real kernel cannot be made to hit on demand.
type fakeLinks struct {
	mu       sync.Mutex
	links    map[uint32]link.Link
	next     uint32
	onVerify func(f *fakeLinks, index uint32)
	deleted  []uint32
}

func newFakeLinks() *fakeLinks { return &fakeLinks{links: map[uint32]link.Link{}, next: 10} }

func ptr[T any](v T) *T { return &v }

// addTap adds a multiqueue tap with the given queue counts and stamp.
func (f *fakeLinks) addTap(id identity.Identity, alias string, queues, disabled uint32) uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	f.links[f.next] = link.Link{
		Index: f.next, Name: id.TapName(), Alias: alias, Kind: "tun", AdminUp: true,
		Carrier: ptr(queues+disabled > 0),
		Tun:     &driver.Tun{Type: driver.TunTypeTap, MultiQueue: true, Persist: true, NumQueues: ptr(queues), NumDisabledQueues: ptr(disabled)},
	}
	return f.next
}

func (f *fakeLinks) update(index uint32, fn func(*link.Link)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.links[index]
	fn(&l)
	f.links[index] = l
}

func (f *fakeLinks) remove(index uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.links, index)
}

func (f *fakeLinks) has(index uint32) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.links[index]
	return ok
}

func (f *fakeLinks) Links(context.Context) ([]link.Link, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []link.Link
	for _, l := range f.links {
		out = append(out, l)
	}
	return out, nil
}

func (f *fakeLinks) Verify(_ context.Context, want link.Expect) (link.Link, error) {
	if f.onVerify != nil {
		f.onVerify(f, want.Index)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.links[want.Index]
	if !ok {
		return link.Link{}, link.ErrLinkGone
	}
	if l.Name != want.Name || l.Alias != want.Alias {
		return l, link.ErrLinkChanged
	}
	return l, nil
}

func (f *fakeLinks) Set(_ context.Context, index uint32, ch link.Change) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.links[index]
	if !ok {
		return link.ErrLinkGone
	}
	if ch.Group != nil {
		l.Group = *ch.Group
	}
	f.links[index] = l
	return nil
}

func (f *fakeLinks) DeleteVerified(ctx context.Context, want link.Expect) error {
	if _, err := f.Verify(ctx, want); err != nil {
		return err
	}
	f.remove(want.Index)
	f.mu.Lock()
	f.deleted = append(f.deleted, want.Index)
	f.mu.Unlock()
	return nil
}

func (f *fakeLinks) DeleteGroup(_ context.Context, group uint32) error {
	if group == 0 {
		return link.ErrDefaultGroup
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, l := range f.links {
		if l.Group == group {
			delete(f.links, i)
			f.deleted = append(f.deleted, i)
		}
	}
	return nil
}

// fakeRegistry records unregistrations; fail makes them fail.
type fakeRegistry struct {
	mu           sync.Mutex
	unregistered []uint32
	fail         error
	onUnregister func(ifindex uint32)
}

func (r *fakeRegistry) UnregisterInterface(_ context.Context, ifindex uint32) error {
	if r.onUnregister != nil {
		r.onUnregister(ifindex)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.unregistered = append(r.unregistered, ifindex)
	return nil
}

// fakeLocker grants every lock except those of busy VPCs.
type fakeLocker struct {
	busy map[identity.VPC]bool
	held int // locks taken and not yet released
}

func (l *fakeLocker) Lock(ctx context.Context, vpc identity.VPC) (func(), error) {
	if l.busy[vpc] {
		<-ctx.Done()
		return nil, fmt.Errorf("lock vrf %s: %w", vpc.VRFName(), ctx.Err())
	}
	l.held++
	return func() { l.held-- }, nil
}

var errInjected = errors.New("injected fault")
