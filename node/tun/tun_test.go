package tun_test

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

func TestOpenRefusesBadNamesAndMismatchedModes(t *testing.T) {
	ns := nettest.NewNS(t)
	if _, err := tun.Open(ns.File, "a-name-far-too-long-for-ifnamsiz", tun.Mode{}); err == nil {
		t.Fatal("Open with a name longer than IFNAMSIZ succeeded")
	}
	nettest.NewTap(t, ns, "mq0", tun.Mode{})
	if _, err := tun.Open(ns.File, "mq0", tun.Mode{SingleQueue: true}); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("single-queue Open of a multiqueue tap = %v, want EINVAL", err)
	}
}

func TestAQueueDetachesAndAttachesAgain(t *testing.T) {
	ns := nettest.NewNS(t)
	f, err := tun.Open(ns.File, "mq0", tun.Mode{})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := tun.DetachQueue(f); err != nil {
		t.Fatal(err)
	}
	if err := tun.AttachQueue(f); err != nil {
		t.Fatal(err)
	}
	if err := tun.SetOwner(f, 1000); err != nil {
		t.Fatal(err)
	}
	if err := tun.SetGroup(f, 1000); err != nil {
		t.Fatal(err)
	}
	links, err := ns.Dial(t).Links(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if l.Name == "mq0" {
			if l.Tun == nil || l.Tun.Owner == nil || *l.Tun.Owner != 1000 || l.Tun.Group == nil || *l.Tun.Group != 1000 {
				t.Fatalf("tun %+v: want owner and group 1000", l.Tun)
			}
			if a, d, ok := l.Tun.QueueCounts(); !ok || a != 1 || d != 0 {
				t.Fatalf("queues %d/%d after re-attach, want 1/0", a, d)
			}
			return
		}
	}
	t.Fatal("mq0 not found")
}
