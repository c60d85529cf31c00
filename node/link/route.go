package link

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
)

// Route is a directly connected route through one link.
type Route struct {
	Dst   netip.Prefix
	Table uint32 // 0 means the main table
	Link  uint32 // ifindex of the outgoing link
}

// ReplaceRoute adds r, or replaces a route to the same destination in the
// same table, so that repeating it is harmless. A route through a link with
// no carrier is accepted and marked linkdown by the kernel.
func (c *Conn) ReplaceRoute(ctx context.Context, r Route) error {
	if !r.Dst.IsValid() || r.Link == 0 {
		return fmt.Errorf("replace route %v via ifindex %d: need a destination and a link", r.Dst, r.Link)
	}
	dst := r.Dst.Masked()
	family := uint8(afInet)
	if dst.Addr().Is6() {
		family = afInet6
	}
	table := r.Table
	if table == 0 {
		table = rtTableMain
	}
	m := &rtnetlink.RouteMessage{
		Family:    family,
		DstLength: uint8(dst.Bits()),
		Table:     rtTableUnspec, // the RTA_TABLE attribute carries all 32 bits
		Protocol:  rtprotStatic,
		Scope:     rtScopeLink,
		Type:      rtnUnicast,
		Attributes: rtnetlink.RouteAttributes{
			Dst:      dst.Addr().AsSlice(),
			OutIface: r.Link,
			Table:    table,
		},
	}
	if table < 256 {
		m.Table = uint8(table)
	}
	_, err := c.execute(ctx, rtmNewRoute, netlink.Request|netlink.Acknowledge|netlink.Create|netlink.Replace, m)
	if err != nil {
		return fmt.Errorf("replace route %v table %d via ifindex %d: %w", dst, table, r.Link, err)
	}
	return nil
}

// RoutesVia lists the destinations of the routes through ifindex in table,
// both families: what CNI CHECK compares with the routes ADD set up.
func (c *Conn) RoutesVia(ctx context.Context, ifindex, table uint32) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, family := range []uint8{afInet, afInet6} {
		req := &rtnetlink.RouteMessage{Family: family}
		msgs, err := c.execute(ctx, rtmGetRoute, netlink.Request|netlink.Dump, req)
		if err != nil {
			return nil, fmt.Errorf("list routes via ifindex %d: %w", ifindex, err)
		}
		for _, msg := range msgs {
			if msg.Header.Type != rtmNewRoute {
				continue
			}
			var m rtnetlink.RouteMessage
			if err := m.UnmarshalBinary(msg.Data); err != nil {
				return nil, fmt.Errorf("list routes via ifindex %d: decode: %w", ifindex, err)
			}
			t := m.Attributes.Table
			if t == 0 {
				t = uint32(m.Table)
			}
			if m.Attributes.OutIface != ifindex || t != table || m.Attributes.Dst == nil {
				continue
			}
			addr, ok := netip.AddrFromSlice(m.Attributes.Dst)
			if !ok {
				continue
			}
			out = append(out, netip.PrefixFrom(addr.Unmap(), int(m.DstLength)))
		}
	}
	return out, nil
}
