// Package vrf serialises changes to one VRF across goroutines and processes:
// the node daemon's reclaim and every CNI plugin invocation take the same
// lock, named after the VRF, before they change a tap of that VPC.
//
// The lock has an in-process half, a one-token channel per VRF, and a
// cross-process half, an open-file-description (OFD) write lock on the
// whole of <dir>/<vrf>.lock taken with F_OFD_SETLKW. A process waiting for
// it sleeps in the kernel's queue of that file's locks, and the kernel
// wakes waiters one at a time in the order they blocked. A storm of plugins
// starting pods of one tenant is thus served in turn, and no waiter burns
// CPU the holder needs. (Polling a non-blocking flock, as this package
// once did, served no order: an unlucky waiter could lose every race until
// its timeout, and the polling of hundreds of waiters slowed the holder
// they waited for.) OFD locks, unlike classic fcntl locks, belong to the
// open file, not the process, so two opens in one process exclude each
// other and closing an unrelated descriptor of the file releases nothing.
//
// A blocked F_OFD_SETLKW cannot be abandoned: Go installs its signal
// handlers with SA_RESTART, so no signal ends the call, and the kernel
// offers no timeout. It therefore runs on a goroutine of its own. When the
// caller's context ends, Lock returns at once and that goroutine stays in
// the queue until it gets the lock, then releases it by closing the file.
// Until then it keeps the process's token for the VRF, so a process never
// has more than one thread blocked per VRF: the daemon's threads stay
// bounded by the VRFs it touches, however many of its lock attempts time
// out, and its later attempts queue on the token, where waiting can be
// abandoned, until the abandoned one has had its turn. A plugin that gives
// up simply exits, and the kernel drops its waiter with its files.
//
// Plugin and daemon binaries before this one take only flock(2) on the
// same file, and on Linux flock and OFD locks do not see each other. So
// that both kinds exclude each other while a node is upgraded, the OFD
// holder also takes the flock, blocking. Among processes of this version
// only the OFD holder ever asks for the flock, so it waits only for an old
// process holding it; and old processes never ask for the OFD lock, so no
// process waits on one kind while holding the other the waiter needs.
//
// Lock files are never unlinked. Both kinds of lock lock an inode, not a
// path: if a holder unlinked the file on release while another process had
// it open and was waiting, a third process would create a new file at the
// same path and lock a different inode, and two processes would both hold
// "the" lock. One small file per VPC ever seen on the node is the price,
// and /run is cleared at boot.
package vrf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

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
// that waiting can be abandoned when a context ends. The token is held from
// the start of the kernel wait until the file lock is released, whether by
// the caller's unlock or by an abandoned waiter once it has had its turn.
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

// fileLock is what the kernel wait hands back: the locked file, or why
// there is none.
type fileLock struct {
	f   *os.File
	err error
}

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
	leave := func() {
		<-s.token
		l.releaseSlot(vpc)
	}
	if err := ctx.Err(); err != nil { // ended while the token was free
		leave()
		return nil, fmt.Errorf("lock vrf %s: %w", name, err)
	}

	// got is unbuffered: the waiter hands the file over only while Lock is
	// still there to take it, and otherwise sees abandoned and releases
	// the lock itself, so the file is never dropped by both or neither.
	got := make(chan fileLock)
	abandoned := make(chan struct{})
	path := filepath.Join(l.dir, name+".lock")
	go func() {
		f, err := lockFile(path)
		select {
		case got <- fileLock{f, err}:
		case <-abandoned:
			if f != nil {
				f.Close() // releases both locks
			}
			leave()
		}
	}()
	select {
	case fl := <-got:
		if fl.err != nil {
			leave()
			return nil, fmt.Errorf("lock vrf %s: %w", name, fl.err)
		}
		var once sync.Once
		return func() {
			once.Do(func() {
				fl.f.Close() // releases both locks
				leave()
			})
		}, nil
	case <-ctx.Done():
		close(abandoned)
		return nil, fmt.Errorf("lock vrf %s: %w", name, ctx.Err())
	}
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

// lockFile opens the lock file at path and takes, waiting in the kernel
// for as long as it takes, first an OFD write lock on the whole file and
// then an exclusive flock for processes of older versions (see the package
// doc). Closing the returned file releases both. The file is opened
// close-on-exec, as os opens every file, so no child inherits the lock.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	// Len 0 locks from Start to whatever the end of the file ever is: the
	// whole file, so every locker conflicts with every other.
	whole := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart, Start: 0, Len: 0}
	if err := retryEINTR(func() error { return unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLKW, &whole) }); err != nil {
		f.Close()
		return nil, fmt.Errorf("ofd lock %s: %w", path, err)
	}
	if err := retryEINTR(func() error { return unix.Flock(int(f.Fd()), unix.LOCK_EX) }); err != nil {
		f.Close() // releases the OFD lock too
		return nil, fmt.Errorf("flock %s: %w", path, err)
	}
	return f, nil
}

// retryEINTR calls op again while it fails with EINTR. Go's handlers ask
// the kernel to restart both waits, but a handler installed by foreign code
// (cgo) might not.
func retryEINTR(op func() error) error {
	for {
		if err := op(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
