package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/dropwatch"
	"github.com/datum-cloud/galactic-node/node/link"
)

// dropSource turns the program's drop records into what operators read:
// the tap's name (from the kernel, cached briefly: a flood of one tap's
// drops costs one lookup) and its identity in base62.
type dropSource struct {
	mon   *datapath.DropMonitor
	links *link.Conn

	mu    sync.Mutex
	names map[uint32]cachedName
}

type cachedName struct {
	name string
	at   time.Time
}

// tapNameTTL bounds how long a name is reused: the kernel reuses ifindexes.
const tapNameTTL = 5 * time.Second

func newDropSource(mon *datapath.DropMonitor, links *link.Conn) *dropSource {
	return &dropSource{mon: mon, links: links, names: map[uint32]cachedName{}}
}

func (s *dropSource) Close() error { return s.mon.Close() }

func (s *dropSource) Next() (dropwatch.Record, error) {
	r, err := s.mon.Read()
	if errors.Is(err, os.ErrClosed) {
		return dropwatch.Record{}, fmt.Errorf("%w: %w", dropwatch.ErrClosed, err)
	}
	if err != nil {
		return dropwatch.Record{}, err
	}
	return s.record(r), nil
}

func (s *dropSource) tapName(ifindex uint32, now time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.names[ifindex]; ok && now.Sub(c.at) < tapNameTTL {
		return c.name
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	name := ""
	if l, err := s.links.Get(ctx, ifindex); err == nil {
		name = l.Name
	}
	if len(s.names) > 4096 {
		clear(s.names)
	}
	s.names[ifindex] = cachedName{name, now}
	return name
}

func (s *dropSource) record(r datapath.DropRecord) dropwatch.Record {
	out := dropwatch.Record{
		Time: r.Time, Ifindex: r.Ifindex, Tap: s.tapName(r.Ifindex, time.Now()), Rule: r.Rule, RuleName: datapath.RuleName(r.Rule),
		Length: r.Length, SrcPort: r.SrcPort, DstPort: r.DstPort,
	}
	if r.NoRules {
		out.Decision = datapath.ReasonPolicyUnavailable.String()
	} else {
		out.Decision = r.Decision.String()
		id := attachreg.IdentityOf(r.VPC, r.Attachment)
		out.VPC, out.Attachment = id.VPC.Base62(), id.Attachment.Base62()
	}
	if r.SrcMAC != nil {
		out.SrcMAC, out.DstMAC = r.SrcMAC.String(), r.DstMAC.String()
		out.EtherType = etherTypeName(r.EtherType)
	}
	if r.SrcIP.IsValid() {
		out.SrcIP, out.DstIP = r.SrcIP.String(), r.DstIP.String()
	}
	if r.SrcIP.IsValid() && r.EtherType != 0x0806 {
		out.Protocol = protocolName(r.Protocol)
	}
	if r.ICMP {
		t, c := r.ICMPType, r.ICMPCode
		out.ICMPType, out.ICMPCode = &t, &c
	}
	return out
}

func etherTypeName(t uint16) string {
	switch t {
	case 0x0800:
		return "ipv4"
	case 0x86dd:
		return "ipv6"
	case 0x0806:
		return "arp"
	case 0x8100, 0x88a8:
		return "vlan"
	}
	return fmt.Sprintf("0x%04x", t)
}

func protocolName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}
