package driver

import (
	"encoding/binary"
	"testing"

	"github.com/mdlayher/netlink"
)

// FuzzTunDecode feeds arbitrary IFLA_INFO_DATA to the tun driver: it must
// never panic, and whatever it accepts must be a tun or tap type whose
// queue counts are either both reported or both absent.
func FuzzTunDecode(f *testing.F) {
	f.Add(concat(attr(iflaTunType, iffTap), attr(iflaTunMultiQueue, 1),
		attr(iflaTunNumQueues, u32(1)...), attr(iflaTunNumDisabledQueues, u32(0)...)))
	f.Add(concat(attr(iflaTunType, iffTap), attr(iflaTunOwner, u32(7)...)))
	f.Add([]byte{4, 0, 3, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		ad, err := netlink.NewAttributeDecoder(b)
		if err != nil {
			return
		}
		ad.ByteOrder = binary.NativeEndian
		tun := &Tun{}
		_ = tun.Decode(ad)
		if tun.Err() != nil {
			return
		}
		if tun.Type != TunTypeTap && tun.Type != TunTypeTun {
			t.Fatalf("accepted type %d", tun.Type)
		}
	})
}
