package driver

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/mdlayher/netlink"
)

// attr encodes one netlink attribute by hand, so that fixtures do not depend
// on the encoder under test.
func attr(typ uint16, payload ...byte) []byte {
	b := make([]byte, 4, 4+len(payload)+3)
	binary.NativeEndian.PutUint16(b[0:2], uint16(4+len(payload)))
	binary.NativeEndian.PutUint16(b[2:4], typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

func concat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func decodeTun(t *testing.T, b []byte) *Tun {
	t.Helper()
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		t.Fatalf("NewAttributeDecoder: %v", err)
	}
	ad.ByteOrder = binary.NativeEndian
	tun := &Tun{}
	_ = tun.Decode(ad)
	return tun
}

func ptr(v uint32) *uint32 { return &v }

func TestTunDecodesEveryAttribute(t *testing.T) {
	// A persistent multiqueue tap owned by uid 107, group 36, one queue
	// attached and one disabled: IFLA_INFO_DATA as the kernel sends it.
	b := concat(
		attr(iflaTunOwner, u32(107)...),
		attr(iflaTunGroup, u32(36)...),
		attr(iflaTunType, iffTap),
		attr(iflaTunPI, 0),
		attr(iflaTunVnetHdr, 1),
		attr(iflaTunPersist, 1),
		attr(iflaTunMultiQueue, 1),
		attr(iflaTunNumQueues, u32(1)...),
		attr(iflaTunNumDisabledQueues, u32(1)...),
	)
	got := decodeTun(t, b)
	if err := got.Err(); err != nil {
		t.Fatalf("Err() = %v", err)
	}
	want := Tun{Owner: ptr(107), Group: ptr(36), Type: TunTypeTap, VnetHdr: true, Persist: true,
		MultiQueue: true, NumQueues: ptr(1), NumDisabledQueues: ptr(1)}
	if *got.Owner != *want.Owner || *got.Group != *want.Group || got.Type != want.Type || got.PI ||
		!got.VnetHdr || !got.Persist || !got.MultiQueue {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}
	a, d, ok := got.QueueCounts()
	if !ok || a != 1 || d != 1 {
		t.Fatalf("QueueCounts() = %d, %d, %v; want 1, 1, true", a, d, ok)
	}
}

func TestSingleQueueTunReportsNoCounts(t *testing.T) {
	b := concat(
		attr(iflaTunType, iffTap),
		attr(iflaTunPI, 0),
		attr(iflaTunVnetHdr, 0),
		attr(iflaTunPersist, 1),
		attr(iflaTunMultiQueue, 0),
	)
	got := decodeTun(t, b)
	if got.Err() != nil || got.MultiQueue || got.Owner != nil || got.Group != nil {
		t.Fatalf("decoded %+v, err %v", got, got.Err())
	}
	if _, _, ok := got.QueueCounts(); ok {
		t.Fatal("QueueCounts() ok for a single-queue tap")
	}
}

func TestTunSkipsAttributesOfNewerKernels(t *testing.T) {
	got := decodeTun(t, concat(attr(iflaTunType, iffTap), attr(200, 1, 2, 3, 4)))
	if got.Err() != nil || got.Type != TunTypeTap {
		t.Fatalf("decoded %+v, err %v", got, got.Err())
	}
}

func TestMalformedTunAttributesAreErrors(t *testing.T) {
	for name, b := range map[string][]byte{
		"short queue count": concat(attr(iflaTunType, iffTap), attr(iflaTunNumQueues, 1, 0)),
		"long type":         attr(iflaTunType, 2, 0, 0, 0),
		"short owner":       concat(attr(iflaTunType, iffTap), attr(iflaTunOwner, 7)),
		"unknown type":      attr(iflaTunType, 9),
		"no type":           attr(iflaTunPersist, 1),
	} {
		if got := decodeTun(t, b); got.Err() == nil {
			t.Errorf("%s: decoded %+v without error", name, got)
		}
	}
}

func TestTunRefusesToEncode(t *testing.T) {
	if err := (&Tun{}).Encode(netlink.NewAttributeEncoder()); !errors.Is(err, ErrTunNotCreatable) {
		t.Fatalf("Encode err = %v, want ErrTunNotCreatable", err)
	}
}

func TestVRFTableRoundTrips(t *testing.T) {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.NativeEndian
	if err := (&VRF{Table: 1062}).Encode(ae); err != nil {
		t.Fatal(err)
	}
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if want := attr(iflaVRFTable, u32(1062)...); string(b) != string(want) {
		t.Fatalf("encoded % x, want % x", b, want)
	}
	ad, _ := netlink.NewAttributeDecoder(b)
	ad.ByteOrder = binary.NativeEndian
	var v VRF
	if err := v.Decode(ad); err != nil || v.Table != 1062 {
		t.Fatalf("decoded %+v, %v", v, err)
	}
	if err := (&VRF{}).Encode(netlink.NewAttributeEncoder()); err == nil {
		t.Fatal("Encode of table 0 succeeded")
	}
}
