package link

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

func nlmsg(typ uint16, flags netlink.HeaderFlags, seq uint32, data []byte) []byte {
	b := make([]byte, sizeofNlMsghdr, sizeofNlMsghdr+len(data)+3)
	binary.NativeEndian.PutUint32(b[0:4], uint32(sizeofNlMsghdr+len(data)))
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint16(b[6:8], uint16(flags))
	binary.NativeEndian.PutUint32(b[8:12], seq)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func linkMsg(t *testing.T, index uint32, name string) []byte {
	t.Helper()
	b, err := (&rtnetlink.LinkMessage{Index: index, Attributes: &rtnetlink.LinkAttributes{Name: name}}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAnInterruptFlagOnlyOnDoneIsSeen(t *testing.T) {
	multi := netlink.Multi
	chunk := append(nlmsg(rtmNewLink, multi, 7, linkMsg(t, 1, "lo")),
		nlmsg(nlmsgDone, multi|netlink.DumpInterrupted, 7, make([]byte, 4))...)
	var links []Link
	done, interrupted, err := parseDumpChunk(chunk, 7, &links)
	if err != nil || !done || !interrupted || len(links) != 1 || links[0].Name != "lo" {
		t.Fatalf("done=%v interrupted=%v err=%v links=%+v", done, interrupted, err, links)
	}
}

func TestLeftoversOfAnEarlierRequestAreSkipped(t *testing.T) {
	chunk := append(nlmsg(rtmNewLink, netlink.Multi|netlink.DumpInterrupted, 6, linkMsg(t, 9, "stale")),
		nlmsg(rtmNewLink, netlink.Multi, 7, linkMsg(t, 1, "lo"))...)
	var links []Link
	done, interrupted, err := parseDumpChunk(chunk, 7, &links)
	if err != nil || done || interrupted || len(links) != 1 || links[0].Index != 1 {
		t.Fatalf("done=%v interrupted=%v err=%v links=%+v", done, interrupted, err, links)
	}
}

func TestADumpErrorIsReturned(t *testing.T) {
	code := -int32(unix.ENOBUFS)
	errno := binary.NativeEndian.AppendUint32(nil, uint32(code))
	var links []Link
	_, _, err := parseDumpChunk(nlmsg(nlmsgDone, netlink.Multi, 3, errno), 3, &links)
	if !errors.Is(err, unix.ENOBUFS) {
		t.Fatalf("err = %v, want ENOBUFS", err)
	}
	_, _, err = parseDumpChunk(nlmsg(rtmNewLink, netlink.Multi, 3, []byte{1, 2})[:18], 3, &links)
	if err == nil {
		t.Fatal("a truncated message decoded without error")
	}
}
