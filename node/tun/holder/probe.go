package holder

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tun"
)

// ErrHeld is returned by Prober.Claim when the kernel shows that another
// file holds the tap.
var ErrHeld = errors.New("held by another file")

// Links reads a link again; *link.Conn implements it.
type Links interface {
	Verify(ctx context.Context, want link.Expect) (link.Link, error)
}

// Prober asks the kernel whether anything holds a tap by attaching a queue
// of its own to it (TUNSETIFF on the existing device).
//
// On a single-queue tap the kernel takes one file (drivers/net/tun.c,
// tun_attach): EBUSY means held, by whatever file, in a process's table, in
// flight over SCM_RIGHTS, or registered in an io_uring. Success means the
// claim holds the only queue, and every other attach fails until it is
// released: what the removal keeps open through its verified delete.
//
// A multiqueue tap takes up to 256 files, so a claim there proves less: the
// queue counts read after attaching must show the claim's queue alone, and
// a VMM may still attach between that read and the delete (the window
// docs/kernel.md measures).
//
// A probe owns the tap while it runs, so a VMM opening the tap at that
// moment fails: callers probe only taps that every other check already
// calls free, at the removal stage.
type Prober struct {
	// NS is the network namespace of the taps; nil: the caller's.
	NS *os.File
	// Links re-reads the tap after attaching: that the attach found the
	// tap that was judged (TUNSETIFF creates a tap of that name if it is
	// gone), and its queue counts.
	Links Links
}

// Claim is a Prober's own attachment to a tap.
type Claim struct {
	file       *os.File
	multiQueue bool
}

// Claim attaches to t and returns the claim when nothing else holds it. It
// returns an error wrapping ErrHeld when the kernel shows another holder,
// link.ErrLinkGone or link.ErrLinkChanged when t is no longer what was
// read, and any other error when the kernel could not be asked. Only a
// returned claim needs releasing.
func (p Prober) Claim(ctx context.Context, t link.Tap) (*Claim, error) {
	if t.Tun == nil || t.Tun.Err() != nil {
		return nil, fmt.Errorf("probe %s: tun attributes missing or undecodable: %w", t.Name, ErrHeld)
	}
	mode := tun.Mode{SingleQueue: !t.Tun.MultiQueue, PacketInfo: t.Tun.PI, VnetHdr: t.Tun.VnetHdr}
	f, err := tun.Open(p.NS, t.Name, mode)
	if errors.Is(err, unix.EBUSY) {
		return nil, fmt.Errorf("probe %s: the kernel refused a second file on its single queue (EBUSY): %w", t.Name, ErrHeld)
	}
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", t.Name, err)
	}
	c := &Claim{file: f, multiQueue: t.Tun.MultiQueue}
	l, err := p.Links.Verify(ctx, link.Expect{Index: t.Index, Name: t.Name, Alias: t.Alias})
	if err != nil {
		c.Release()
		return nil, fmt.Errorf("probe %s: read again after attaching: %w", t.Name, err)
	}
	if held, why := c.HeldByOthers(l); held {
		c.Release()
		return nil, fmt.Errorf("probe %s: %s: %w", t.Name, why, ErrHeld)
	}
	return c, nil
}

// HeldByOthers reports whether l, read while the claim is attached to it,
// shows a file other than the claim's, and why. A single-queue tap cannot:
// the kernel refuses every other file while the claim holds its queue.
func (c *Claim) HeldByOthers(l link.Link) (bool, string) {
	if !c.multiQueue {
		return false, ""
	}
	if l.Tun == nil || l.Tun.Err() != nil {
		return true, "tun attributes missing or undecodable: presumed held"
	}
	attached, disabled, ok := l.Tun.QueueCounts()
	switch {
	case !ok:
		return true, "queue counts missing: presumed held"
	case attached != 1 || disabled != 0:
		return true, fmt.Sprintf("%d queues attached and %d disabled with the probe's own attached", attached, disabled)
	}
	return false, ""
}

// Release detaches the claim. After the tap was deleted the kernel has
// already detached it; before, the tap is left as the probe found it,
// persistent with no file. Release is idempotent.
func (c *Claim) Release() {
	if c != nil && c.file != nil {
		c.file.Close()
		c.file = nil
	}
}

// CanProbe reports whether this process can open the tun device a probe
// attaches through; it attaches nothing.
func CanProbe() error { return tun.CanOpen() }
