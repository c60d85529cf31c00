package holder

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/datum-cloud/galactic-node/node/link"
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
// A probe owns a single-queue tap while it runs, so a VMM opening that tap
// at that moment fails (EBUSY): callers probe only taps that every other
// check already calls free, at the removal stage.
type Prober struct {
	// NS is the network namespace of the taps; nil: the caller's.
	NS *os.File
	// Links re-reads the tap after attaching: that the attach found the
	// tap that was judged (TUNSETIFF creates a tap of that name if it is
	// gone), and its queue counts.
	Links Links
}

// Claim is a Prober's own attachment to a tap. The zero Claim holds
// nothing and sees no other holder.
type Claim struct {
	file       *os.File
	multiQueue bool
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
