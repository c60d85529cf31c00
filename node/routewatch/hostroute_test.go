package routewatch

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// route builds a route message as the kernel sends it.
func route(family, dstLen, typ, table uint8, attrs ...netlink.Attribute) []byte {
	b := make([]byte, unix.SizeofRtMsg)
	b[0], b[1], b[4], b[7] = family, dstLen, table, typ
	if len(attrs) > 0 {
		a, err := netlink.MarshalAttributes(attrs)
		if err != nil {
			panic(err)
		}
		b = append(b, a...)
	}
	return b
}

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func TestParseHostRoute(t *testing.T) {
	for _, c := range []struct {
		name string
		msg  []byte
		want hostRoute
		ok   bool
		err  bool
	}{
		{"a local address", route(unix.AF_INET, 32, unix.RTN_LOCAL, unix.RT_TABLE_LOCAL,
			netlink.Attribute{Type: unix.RTA_TABLE, Data: u32(unix.RT_TABLE_LOCAL)},
			netlink.Attribute{Type: unix.RTA_DST, Data: []byte{10, 0, 0, 1}}),
			hostRoute{table: unix.RT_TABLE_LOCAL, typ: unix.RTN_LOCAL, dst: netip.MustParsePrefix("10.0.0.1/32")}, true, false},
		{"a VRF's table, from RTA_TABLE", route(unix.AF_INET6, 128, unix.RTN_ANYCAST, unix.RT_TABLE_COMPAT,
			netlink.Attribute{Type: unix.RTA_TABLE, Data: u32(1062)},
			netlink.Attribute{Type: unix.RTA_DST, Data: netip.MustParseAddr("fd00::").AsSlice()}),
			hostRoute{table: 1062, typ: unix.RTN_ANYCAST, dst: netip.MustParsePrefix("fd00::/128")}, true, false},
		{"everything local (AnyIP), no RTA_DST", route(unix.AF_INET, 0, unix.RTN_LOCAL, 100),
			hostRoute{table: 100, typ: unix.RTN_LOCAL, dst: netip.MustParsePrefix("0.0.0.0/0")}, true, false},
		{"a unicast route", route(unix.AF_INET, 24, unix.RTN_UNICAST, unix.RT_TABLE_MAIN), hostRoute{}, false, false},
		{"a multicast route", route(unix.AF_INET6, 8, unix.RTN_MULTICAST, unix.RT_TABLE_LOCAL), hostRoute{}, false, false},
		{"too short", []byte{unix.AF_INET, 32}, hostRoute{}, false, true},
		{"a prefix longer than its family", route(unix.AF_INET, 33, unix.RTN_LOCAL, unix.RT_TABLE_LOCAL), hostRoute{}, false, true},
		{"a destination of the wrong size", route(unix.AF_INET, 32, unix.RTN_LOCAL, unix.RT_TABLE_LOCAL,
			netlink.Attribute{Type: unix.RTA_DST, Data: []byte{10, 0, 0}}), hostRoute{}, false, true},
		{"a truncated attribute", append(route(unix.AF_INET, 32, unix.RTN_LOCAL, unix.RT_TABLE_LOCAL), 8, 0, 1, 0, 10), hostRoute{}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok, err := parseHostRoute(c.msg)
			if c.err {
				if !errors.Is(err, errMalformedRoute) {
					t.Fatalf("err = %v, want errMalformedRoute", err)
				}
				return
			}
			if err != nil || ok != c.ok || got != c.want {
				t.Fatalf("got %+v, %v, %v; want %+v, %v, nil", got, ok, err, c.want, c.ok)
			}
		})
	}
}
