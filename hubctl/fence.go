package hubctl

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// ErrDeposed: this instance may no longer hold the leader Lease, so it
// must not write; another instance may already be leading.
var ErrDeposed = errors.New("not leading: the leader lease may have passed to another instance")

// Fence guards every write the controller makes against a deposed leader:
// an instance paused (SIGSTOP, a stalled node) past its lease wakes up with
// work in hand while another instance leads.
type Fence interface {
	// Hold is asked right before one write. It returns ErrDeposed (wrapped)
	// when the lease may have passed, and otherwise a context for the write
	// that ends when it may pass, so that a write held up in flight is
	// abandoned rather than landing under the next leader.
	Hold(ctx context.Context) (context.Context, context.CancelFunc, error)
}

// Unfenced lets every write through: for a controller that runs alone,
// without a lease.
type Unfenced struct{}

// Hold implements Fence.
func (Unfenced) Hold(ctx context.Context) (context.Context, context.CancelFunc, error) {
	ctx, cancel := context.WithCancel(ctx)
	return ctx, cancel, nil
}

// LeaseFence is the Fence of an instance elected by RunAsLeader (give it
// with WithFence). It makes no API request per write: it remembers when
// this instance's last successful acquire or renew of the Lease started,
// and lets a write through only while
//
//	now < that start + the lease duration - margin
//
// on this process's monotonic clock.
//
// Why no other instance can lead before that: client-go's elector in
// another instance takes the Lease only once the lease duration has passed,
// on its own clock, since it observed the record our renew wrote (it times
// the lease from its own observation, not from the record's renewTime, so
// the hosts' clock offsets do not matter). It observed that record after the
// API server stored it, which is after our request started. A take-over
// based on an older record fails on the Lease's resourceVersion. The lease
// duration is the one the record carries, which client-go writes in whole
// seconds (truncated), and the other instance reads.
//
// The margin, the larger of the retry period and 1 s, covers what that
// reasoning leaves out:
//   - a write let through just before the fence closes is abandoned by the
//     client when it closes (Hold's context, checked against the clock at
//     the wire by FenceTransport), but one already on the wire can still be
//     stored by the API server a moment later;
//   - the hosts' monotonic clocks may run at slightly different rates (NTP
//     slews by at most 500 ppm: 7.5 ms over a 15 s lease).
//
// It costs a healthy leader nothing: it renews every retry period, far
// inside the window. One that cannot renew gives up leading at its renew
// deadline; should the window close first (a renew deadline close to the
// lease), its writes are refused until then, which is the safe side.
//
// What no client-side fence covers: a pause between the last check and the
// request's first bytes on the connection, a write delayed on the network
// (a partition) for longer than the margin after it was sent, and a host
// whose monotonic clock stops while the process waits (a suspended machine;
// a stopped or starved process and a frozen cgroup keep counting). Only a
// precondition the API server checks would.
type LeaseFence struct {
	margin time.Duration
	// now is the monotonic clock: time.Now but in tests.
	now func() time.Time

	mu sync.Mutex
	// start is when the last successful acquire or renew of the Lease by
	// this instance started; zero while the fence is closed.
	start time.Time
	// lease is the duration that record carries.
	lease time.Duration
	// stopped: leadership ended; no later write of the Lease reopens it.
	stopped bool
	// open ends when the fence closes (our release, the end of leading):
	// a write let through before then is abandoned then too, not only
	// the writes asked for after. client-go releases the Lease before it
	// cancels the leader's context, so workers run on meanwhile, and a
	// write held earlier, waiting on the client's rate limiter, would
	// otherwise go out after another instance may have taken the Lease.
	open      context.Context
	closeOpen context.CancelFunc
}

// minFenceMargin is the least margin of a LeaseFence; see LeaseFence.
const minFenceMargin = time.Second

// NewLeaseFence returns a closed fence for an elector with timing: it opens
// on the first acquire of the Lease.
func NewLeaseFence(timing LeaseTiming) *LeaseFence {
	return &LeaseFence{margin: fenceMargin(timing), now: time.Now}
}

// fenceMargin is a LeaseFence's margin for timing; see LeaseFence.
func fenceMargin(timing LeaseTiming) time.Duration { return max(timing.RetryPeriod, minFenceMargin) }

// Hold implements Fence. On error, the context is ctx and cancel does
// nothing.
func (f *LeaseFence) Hold(ctx context.Context) (context.Context, context.CancelFunc, error) {
	f.mu.Lock()
	start, lease, stopped, open := f.start, f.lease, f.stopped, f.open
	now := f.now()
	f.mu.Unlock()
	switch {
	case stopped:
		return ctx, func() {}, fmt.Errorf("hold the lease fence: leadership ended: %w", ErrDeposed)
	case start.IsZero():
		return ctx, func() {}, fmt.Errorf("hold the lease fence: the lease is not held: %w", ErrDeposed)
	}
	left := start.Add(lease - f.margin).Sub(now)
	if left <= 0 {
		return ctx, func() {}, fmt.Errorf("hold the lease fence: last renewal started %s ago, for a lease of %s less a margin of %s: %w",
			now.Sub(start).Round(time.Millisecond), lease, f.margin, ErrDeposed)
	}
	if err := ctx.Err(); err != nil {
		return ctx, func() {}, err
	}
	if d, ok := ctx.Deadline(); ok {
		left = min(left, time.Until(d))
	}
	// The write's context is the fence's, so that its closing ends the
	// write at once (a parent's cancel reaches its children before it
	// returns); the caller's end reaches it through AfterFunc, and its
	// values through valuesOf.
	write, cancel := context.WithTimeout(open, left)
	unlink := context.AfterFunc(ctx, cancel)
	return valuesOf{Context: write, values: ctx}, func() { unlink(); cancel() }, nil
}

// valuesOf is a write's context: done as Context is, with the values of
// the caller's.
type valuesOf struct {
	context.Context
	values context.Context
}

func (c valuesOf) Value(key any) any { return c.values.Value(key) }

// closeLocked closes the fence, abandoning every write it let through;
// f.mu is held.
func (f *LeaseFence) closeLocked() {
	f.start = time.Time{}
	if f.closeOpen != nil {
		f.closeOpen()
		f.open, f.closeOpen = nil, nil
	}
}

// wrote is told that a write of the Lease record rec, which started at
// start, succeeded. A record of another holder (our release) closes the
// fence; so does rec's write being about to start (see recordingLock).
func (f *LeaseFence) wrote(start time.Time, rec resourcelock.LeaderElectionRecord, id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped || rec.HolderIdentity != id {
		f.closeLocked()
		return
	}
	if start.Before(f.start) {
		return // never moves back
	}
	if f.open == nil {
		f.open, f.closeOpen = context.WithCancel(context.Background())
	}
	f.start, f.lease = start, time.Duration(rec.LeaseDurationSeconds)*time.Second
}

// stop closes the fence for good: this instance stopped leading.
func (f *LeaseFence) stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
	f.closeLocked()
}

// recordingLock is the elector's Lease lock, telling fence of each record
// it writes and when that write started.
type recordingLock struct {
	resourcelock.Interface
	fence *LeaseFence
}

// Create implements resourcelock.Interface.
func (l recordingLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, rec, l.Interface.Create)
}

// Update implements resourcelock.Interface.
func (l recordingLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	return l.write(ctx, rec, l.Interface.Update)
}

func (l recordingLock) write(ctx context.Context, rec resourcelock.LeaderElectionRecord,
	write func(context.Context, resourcelock.LeaderElectionRecord) error) error {
	id := l.Identity()
	if rec.HolderIdentity != id {
		// Our release: another instance may take the Lease the moment it
		// is stored, even if our client never hears back.
		l.fence.wrote(time.Time{}, rec, id)
	}
	start := l.fence.now()
	if err := write(ctx, rec); err != nil {
		return err
	}
	l.fence.wrote(start, rec, id)
	return nil
}

// FenceTransport refuses to send a request whose context's deadline has
// passed, read from the clock rather than from the context. Go cancels a
// context at its deadline from a timer, and a process resumed after a pause
// (SIGSTOP past its lease) runs its goroutines before those timers: a write
// held by the fence before the pause, waiting on the client's rate limit,
// would be sent on waking with its context not yet cancelled, and cancelled
// only once in flight, after the API server may have acted on it. This is
// the fence's last check before the wire; give it to rest.Config.Wrap,
// which puts it under client-go's own round trippers, next to the
// connection. What it cannot cover is a pause between this check and the
// request's first bytes on the connection.
func FenceTransport(rt http.RoundTripper) http.RoundTripper { return deadlineTransport{rt} }

type deadlineTransport struct{ http.RoundTripper }

// RoundTrip implements http.RoundTripper.
func (t deadlineTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if deadline, ok := req.Context().Deadline(); ok && !time.Now().Before(deadline) {
		if req.Body != nil {
			_ = req.Body.Close() // a RoundTripper closes the body, even on error
		}
		return nil, fmt.Errorf("%s %s: not sent, its deadline passed: %w", req.Method, req.URL.Path, context.DeadlineExceeded)
	}
	return t.RoundTripper.RoundTrip(req)
}
