package holder

import (
	"context"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tun"
)

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

// CanProbe reports whether this process can open the tun device a probe
// attaches through; it attaches nothing.
func CanProbe() error { return tun.CanOpen() }
