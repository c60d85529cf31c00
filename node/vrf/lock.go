// Package vrf serialises changes to one VRF across goroutines and processes:
// the node daemon's reclaim and every CNI plugin invocation take the same
// lock, named after the VRF, before they change a tap of that VPC.
//
// The lock is an in-process mutex plus flock(2) on <dir>/<vrf>.lock. Lock
// files are never unlinked. flock locks an inode, not a path: if a holder
// unlinked the file on release while another process had it open and was
// waiting, a third process would create a new file at the same path and lock
// a different inode, and two processes would both hold "the" lock. One small
// file per VPC ever seen on the node is the price, and /run is cleared at
// boot.
package vrf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/identity"
)

// DefaultDir is where lock files live unless configured otherwise.
const DefaultDir = "/run/galactic/vrf"

// Locker hands out per-VRF locks. Its zero value is not usable; use
// NewLocker. Every process that changes a VRF's taps must use the same dir.
type Locker struct {
	dir string

	mu    sync.Mutex
	slots map[identity.VPC]*slot
}

// slot is the in-process half of one VRF's lock: a one-token channel, so
// that waiting can be abandoned when a context ends.
type slot struct {
	token chan struct{}
	refs  int // goroutines holding or waiting; the slot is dropped at 0
}

// NewLocker returns a Locker whose lock files live in dir, creating dir
// (mode 0700) if needed.
func NewLocker(dir string) (*Locker, error) {
	if dir == "" {
		return nil, errors.New("vrf lock folder: empty path")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("vrf lock folder: %w", err)
	}
	return &Locker{dir: dir, slots: make(map[identity.VPC]*slot)}, nil
}

// Dir is the folder holding the lock files.
func (l *Locker) Dir() string { return l.dir }

// Lock takes the lock of vpc's VRF, waiting until it is free or ctx ends.
// The VRF is named from the identity, not read from a tap's master, so the
// lock holds whether or not the tap is still enslaved. The returned function
// releases the lock; it must be called exactly once.
func (l *Locker) Lock(ctx context.Context, vpc identity.VPC) (unlock func(), err error) {
	if !vpc.Valid() {
		return nil, fmt.Errorf("lock vrf of vpc %d: %w", uint64(vpc), identity.ErrMalformed)
	}
	name := vpc.VRFName()
	s := l.acquireSlot(vpc)
	select {
	case s.token <- struct{}{}:
	case <-ctx.Done():
		l.releaseSlot(vpc)
		return nil, fmt.Errorf("lock vrf %s: %w", name, ctx.Err())
	}
	f, err := l.flock(ctx, name)
	if err != nil {
		<-s.token
		l.releaseSlot(vpc)
		return nil, fmt.Errorf("lock vrf %s: %w", name, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			f.Close() // releases the flock
			<-s.token
			l.releaseSlot(vpc)
		})
	}, nil
}

func (l *Locker) acquireSlot(vpc identity.VPC) *slot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.slots[vpc]
	if s == nil {
		s = &slot{token: make(chan struct{}, 1)}
		l.slots[vpc] = s
	}
	s.refs++
	return s
}

func (l *Locker) releaseSlot(vpc identity.VPC) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.slots[vpc]; s != nil {
		if s.refs--; s.refs == 0 {
			delete(l.slots, vpc)
		}
	}
}

// flock opens the VRF's lock file and takes an exclusive flock on it. A
// blocking flock cannot be abandoned when ctx ends, so it polls with a
// non-blocking one, backing off from 1 ms to 25 ms.
func (l *Locker) flock(ctx context.Context, name string) (*os.File, error) {
	path := filepath.Join(l.dir, name+".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	wait := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			f.Close()
			return nil, ctx.Err()
		}
		wait = min(wait*2, 25*time.Millisecond)
	}
}
