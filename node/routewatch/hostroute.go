package routewatch

import (
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// hostRoute is a route of a type whose destinations the host receives
// packets to, keyed as the kernel tells one route from another in a table.
type hostRoute struct {
	table    uint32
	typ, tos uint8
	priority uint32
	dst      netip.Prefix
}

// errMalformedRoute: a route message too short for what it says it holds.
var errMalformedRoute = errors.New("malformed route message")

// parseHostRoute reads a route message; ok is false for a route of another
// type. Multicast routes are left out: the program takes every multicast
// destination for the host's without asking.
func parseHostRoute(b []byte) (r hostRoute, ok bool, err error) {
	if len(b) < unix.SizeofRtMsg {
		return r, false, fmt.Errorf("%w: %d bytes", errMalformedRoute, len(b))
	}
	family, dstLen, tos, table, typ := b[0], b[1], b[3], b[4], b[7]
	switch typ {
	case unix.RTN_LOCAL, unix.RTN_BROADCAST, unix.RTN_ANYCAST:
	default:
		return r, false, nil
	}
	var size int
	switch family {
	case unix.AF_INET:
		size = 4
	case unix.AF_INET6:
		size = 16
	default:
		return r, false, nil
	}
	if int(dstLen) > 8*size {
		return r, false, fmt.Errorf("%w: /%d in family %d", errMalformedRoute, dstLen, family)
	}
	r = hostRoute{table: uint32(table), typ: typ, tos: tos}
	dst := make([]byte, size)
	ad, err := netlink.NewAttributeDecoder(b[unix.SizeofRtMsg:])
	if err != nil {
		return r, false, fmt.Errorf("%w: %w", errMalformedRoute, err)
	}
	for ad.Next() {
		switch ad.Type() {
		case unix.RTA_DST:
			if len(ad.Bytes()) != size {
				return r, false, fmt.Errorf("%w: destination of %d bytes", errMalformedRoute, len(ad.Bytes()))
			}
			copy(dst, ad.Bytes())
		case unix.RTA_TABLE:
			r.table = ad.Uint32()
		case unix.RTA_PRIORITY:
			r.priority = ad.Uint32()
		}
	}
	if err := ad.Err(); err != nil {
		return r, false, fmt.Errorf("%w: %w", errMalformedRoute, err)
	}
	a, _ := netip.AddrFromSlice(dst)
	r.dst = netip.PrefixFrom(a, int(dstLen)).Masked()
	return r, true, nil
}

// dumpHostRoutes reads every host route of every table in the namespace
// ns (nil: the caller's).
func dumpHostRoutes(ns *os.File) (map[hostRoute]struct{}, error) {
	cfg := &netlink.Config{}
	if ns != nil {
		cfg.NetNS = int(ns.Fd())
	}
	conn, err := netlink.Dial(unix.NETLINK_ROUTE, cfg)
	if err != nil {
		return nil, fmt.Errorf("route watch: dial rtnetlink: %w", err)
	}
	defer conn.Close()
	req := netlink.Message{
		Header: netlink.Header{Type: unix.RTM_GETROUTE, Flags: netlink.Request | netlink.Dump},
		Data:   make([]byte, unix.SizeofRtMsg), // every family, every table
	}
	msgs, err := conn.Execute(req)
	if err != nil {
		return nil, fmt.Errorf("route watch: dump routes: %w", err)
	}
	routes := map[hostRoute]struct{}{}
	for _, m := range msgs {
		r, ok, err := parseHostRoute(m.Data)
		if err != nil {
			return nil, fmt.Errorf("route watch: dump routes: %w", err)
		}
		if ok {
			routes[r] = struct{}{}
		}
	}
	return routes, nil
}
