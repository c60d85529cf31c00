// Package driver holds rtnetlink LinkDrivers for the link kinds this project
// reads or creates that github.com/jsimonetti/rtnetlink/v2 does not know:
// "tun" (decode only: the kernel creates taps through /dev/net/tun, never
// through RTM_NEWLINK) and "vrf".
//
// rtnetlink keeps registered drivers in a process-wide table that is not safe
// for concurrent use; Register adds these drivers once and must run before the
// first Dial, which node/link does for its callers.
package driver

import (
	"errors"
	"fmt"
	"sync"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
)

// TunType is IFLA_TUN_TYPE: whether the device carries IP packets or frames.
type TunType uint8

const (
	TunTypeTun TunType = iffTun // layer 3
	TunTypeTap TunType = iffTap // layer 2: what tenant VMs attach to
)

func (t TunType) String() string {
	switch t {
	case TunTypeTun:
		return "tun"
	case TunTypeTap:
		return "tap"
	}
	return fmt.Sprintf("TunType(%d)", uint8(t))
}

// Tun is the IFLA_INFO_DATA of a link of kind "tun". Pointer fields are
// attributes the kernel sends only sometimes: Owner and Group only when set,
// NumQueues and NumDisabledQueues only for a multiqueue device.
type Tun struct {
	Owner             *uint32
	Group             *uint32
	Type              TunType
	PI                bool // packet information header (IFF_NO_PI unset)
	VnetHdr           bool
	Persist           bool
	MultiQueue        bool
	NumQueues         *uint32 // queues attached to an open file descriptor
	NumDisabledQueues *uint32 // queues detached (TUNSETQUEUE) whose fd is still open

	// decodeErr records a malformed attribute. rtnetlink discards the error a
	// driver returns, so the reader asks for it through Err.
	decodeErr error
}

var _ rtnetlink.LinkDriver = (*Tun)(nil)

// New implements rtnetlink.LinkDriver.
func (*Tun) New() rtnetlink.LinkDriver { return &Tun{} }

// Kind implements rtnetlink.LinkDriver.
func (*Tun) Kind() string { return "tun" }

// ErrTunNotCreatable is returned by Encode: RTM_NEWLINK of kind "tun" is
// refused by the kernel (EOPNOTSUPP); taps are created on /dev/net/tun.
var ErrTunNotCreatable = errors.New("tun devices cannot be created over rtnetlink; use /dev/net/tun")

// Encode implements rtnetlink.LinkDriver. It always fails; see ErrTunNotCreatable.
func (*Tun) Encode(*netlink.AttributeEncoder) error { return ErrTunNotCreatable }

// Decode implements rtnetlink.LinkDriver. Every IFLA_TUN_* attribute is
// decoded; attributes of a newer kernel are skipped. A wrong length or an
// unknown device type is an error, also kept for Err.
func (t *Tun) Decode(ad *netlink.AttributeDecoder) error {
	for ad.Next() {
		switch ad.Type() {
		case iflaTunOwner:
			v := ad.Uint32()
			t.Owner = &v
		case iflaTunGroup:
			v := ad.Uint32()
			t.Group = &v
		case iflaTunType:
			t.Type = TunType(ad.Uint8())
		case iflaTunPI:
			t.PI = ad.Uint8() != 0
		case iflaTunVnetHdr:
			t.VnetHdr = ad.Uint8() != 0
		case iflaTunPersist:
			t.Persist = ad.Uint8() != 0
		case iflaTunMultiQueue:
			t.MultiQueue = ad.Uint8() != 0
		case iflaTunNumQueues:
			v := ad.Uint32()
			t.NumQueues = &v
		case iflaTunNumDisabledQueues:
			v := ad.Uint32()
			t.NumDisabledQueues = &v
		}
	}
	if err := ad.Err(); err != nil {
		t.decodeErr = fmt.Errorf("decode tun attributes: %w", err)
	}
	if t.decodeErr == nil && t.Type != TunTypeTun && t.Type != TunTypeTap {
		t.decodeErr = fmt.Errorf("decode tun attributes: unknown IFLA_TUN_TYPE %d", uint8(t.Type))
	}
	return t.decodeErr
}

// Err returns the error Decode met, if any. A Tun with an error must not be
// trusted to say that nothing holds the device.
func (t *Tun) Err() error { return t.decodeErr }

// QueueCounts returns the attached and disabled queue counts of a multiqueue
// device. ok is false when the kernel did not report both, as for a
// single-queue device.
func (t *Tun) QueueCounts() (attached, disabled uint32, ok bool) {
	if t.NumQueues == nil || t.NumDisabledQueues == nil {
		return 0, 0, false
	}
	return *t.NumQueues, *t.NumDisabledQueues, true
}

// VRF is the IFLA_INFO_DATA of a link of kind "vrf": the routing table its
// slaves' routes live in.
type VRF struct {
	Table uint32
}

var _ rtnetlink.LinkDriver = (*VRF)(nil)

// New implements rtnetlink.LinkDriver.
func (*VRF) New() rtnetlink.LinkDriver { return &VRF{} }

// Kind implements rtnetlink.LinkDriver.
func (*VRF) Kind() string { return "vrf" }

// Encode implements rtnetlink.LinkDriver.
func (v *VRF) Encode(ae *netlink.AttributeEncoder) error {
	if v.Table == 0 {
		return errors.New("encode vrf: table 0 is not a VRF table")
	}
	ae.Uint32(iflaVRFTable, v.Table)
	return nil
}

// Decode implements rtnetlink.LinkDriver.
func (v *VRF) Decode(ad *netlink.AttributeDecoder) error {
	for ad.Next() {
		if ad.Type() == iflaVRFTable {
			v.Table = ad.Uint32()
		}
	}
	return ad.Err()
}

var registerOnce = sync.OnceValue(func() error {
	return errors.Join(rtnetlink.RegisterDriver(&Tun{}), rtnetlink.RegisterDriver(&VRF{}))
})

// Register adds the drivers of this package to rtnetlink's table. It is safe
// to call many times and from many goroutines; the first call registers. It
// must run before any rtnetlink message is decoded.
func Register() error { return registerOnce() }
