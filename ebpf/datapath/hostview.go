package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// The host view tells the program which destinations cannot be the host's,
// so that it forwards them without a route lookup (and without a cached
// answer per destination, which costs a cache miss each when a tenant sprays
// destinations). It is a blocked Bloom filter over the prefixes of the
// host's local, broadcast and anycast routes in every routing table
// (host_filter), trusted until a time the node daemon pushes forward while
// it reads every route event (host_view). The program's side is
// maybe_host in bpf/datapath.c; docs/datapath.md states the rule.
//
// A destination's two bits lie in the block of its /16 (IPv4) or /64
// (IPv6): one picked by its address, set for a host address; one picked by
// the /16 or /64, set for a host prefix that is, or covers, it.

// hostFilterBlocks and hostBlockBits mirror HOST_FILTER_BLOCKS and
// HOST_BLOCK_BITS: 512 blocks of a cache line.
const (
	hostFilterBlocks = 512
	hostBlockBits    = 512
)

// hostViewPartial mirrors HOST_VIEW_PARTIAL: some host prefix is too short
// for the filter (an IPv6 prefix shorter than /64), which then answers
// "maybe" for every destination.
const hostViewPartial = 0x1

// The seeds of a destination's hashes: of its address, and of the /16 or
// /64 it lies in.
const (
	seedAddr4   = unix.AF_INET
	seedAddr6   = unix.AF_INET6
	seedCoarse4 = unix.AF_INET | 0x100
	seedCoarse6 = unix.AF_INET6 | 0x100
)

// hashWords is the program's hash_words.
func hashWords(seed, w0, w1, w2, w3 uint32) uint32 {
	rotl := func(x uint32, n int) uint32 { return x<<n | x>>(32-n) }
	h := seed*0x9e3779b1 ^ w0 ^ rotl(w1, 8) ^ rotl(w2, 16) ^ rotl(w3, 24)
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// addrWords are an address's bytes as the program reads them: 32-bit words
// in the machine's order (the object is built for little-endian machines).
func addrWords(a netip.Addr) [4]uint32 {
	b := a.As16()
	if a.Is4() {
		v4 := a.As4()
		b = [16]byte{}
		copy(b[:], v4[:])
	}
	var w [4]uint32
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return w
}

// hostFilter computes the filter's blocks for prefixes, and whether they
// cover them all (false: some IPv6 prefix is shorter than /64).
func hostFilter(prefixes []netip.Prefix) ([]datapathHostBlock, bool) {
	blocks := make([]datapathHostBlock, hostFilterBlocks)
	// set sets the bit h picks in the block coarse picks.
	set := func(coarse, h uint32) {
		bit := h % hostBlockBits
		blocks[coarse%hostFilterBlocks].Bits[bit/64] |= 1 << (bit % 64)
	}
	complete := true
	for _, p := range prefixes {
		p = p.Masked()
		w := addrWords(p.Addr())
		switch {
		case p.Addr().Is4():
			// Every /16 the prefix covers, or the one it lies in.
			first := binary.BigEndian.Uint16(p.Addr().AsSlice())
			n := 1
			if p.Bits() < 16 {
				n = 1 << (16 - p.Bits())
			}
			for i := range n {
				var b [4]byte
				binary.BigEndian.PutUint16(b[:], first+uint16(i))
				coarse := hashWords(seedCoarse4, binary.LittleEndian.Uint32(b[:]), 0, 0, 0)
				if p.Bits() == 32 {
					set(coarse, hashWords(seedAddr4, w[0], 0, 0, 0))
				} else {
					set(coarse, coarse>>16)
				}
			}
		case p.Bits() >= 64:
			coarse := hashWords(seedCoarse6, w[0], w[1], 0, 0)
			if p.Bits() == 128 {
				set(coarse, hashWords(seedAddr6, w[0], w[1], w[2], w[3]))
			} else {
				set(coarse, coarse>>16)
			}
		default:
			complete = false
		}
	}
	return blocks, complete
}

// PublishHostView writes the filter of the host's prefixes (those of its
// local, broadcast and anycast routes, in every table) and lets the program
// trust it for trustFor. The node daemon calls it for every batch of route
// events it reads, and RenewHostView before the time runs out while it
// keeps reading. One writer at a time: the daemon. Only blocks that changed are
// written; whatever part of a block a frame reads mid-write, each of its
// bits is old or new. A view that stops covering its prefixes is marked so
// before its blocks change.
func (d *Datapath) PublishHostView(prefixes []netip.Prefix, trustFor time.Duration) error {
	if d.objs.HostFilter == nil || d.objs.HostView == nil || d.routeEpoch == nil {
		return fmt.Errorf("publish host view: %w", ErrNoProgramState)
	}
	blocks, complete := hostFilter(prefixes)
	if !complete {
		if err := d.objs.HostView.Put(uint32(0), datapathHostView{Flags: hostViewPartial}); err != nil {
			return fmt.Errorf("publish host view: %w", err)
		}
	}
	for i, b := range blocks {
		if d.hostFilter != nil && d.hostFilter[i] == b {
			continue
		}
		if err := d.objs.HostFilter.Put(uint32(i), b); err != nil {
			// Unknown what the map holds now: write every block next time.
			d.hostFilter = nil
			return fmt.Errorf("publish host view: block %d: %w", i, err)
		}
	}
	d.hostFilter, d.hostFilterPartial = blocks, !complete
	return d.RenewHostView(trustFor)
}

// RenewHostView lets the program trust the view PublishHostView last wrote
// for trustFor from now, without writing the filter again.
func (d *Datapath) RenewHostView(trustFor time.Duration) error {
	if d.objs.HostView == nil {
		return fmt.Errorf("renew host view: %w", ErrNoProgramState)
	}
	if d.hostFilter == nil {
		return errors.New("renew host view: no view was published whole")
	}
	view := datapathHostView{ValidUntil: uint64(monotonicCoarse() + trustFor)}
	if d.hostFilterPartial {
		view.Flags = hostViewPartial
	}
	if err := d.objs.HostView.Put(uint32(0), view); err != nil {
		return fmt.Errorf("renew host view: %w", err)
	}
	return nil
}

// RevokeHostView makes the program stop trusting the host view at once: it
// asks the route lookup for every destination again.
func (d *Datapath) RevokeHostView() error {
	if d.objs.HostView == nil {
		return fmt.Errorf("revoke host view: %w", ErrNoProgramState)
	}
	if err := d.objs.HostView.Put(uint32(0), datapathHostView{}); err != nil {
		return fmt.Errorf("revoke host view: %w", err)
	}
	return nil
}
