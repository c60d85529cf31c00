package netns_test

import (
	"errors"
	"os"
	"testing"

	"github.com/datum-cloud/galactic-node/node/netns"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return nettest.Inode(fi)
}

func TestDoRunsInTheNamespaceAndComesBack(t *testing.T) {
	ns := nettest.NewNS(t)
	target := inode(t, "/run/netns/"+ns.Name)
	before := inode(t, "/proc/thread-self/ns/net")

	var inside uint64
	if err := netns.Do(ns.File, func() error {
		inside = inode(t, "/proc/thread-self/ns/net")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if inside != target {
		t.Fatalf("fn ran in namespace %d, want %d", inside, target)
	}
	if after := inode(t, "/proc/thread-self/ns/net"); after != before {
		t.Fatalf("caller left in namespace %d, was %d", after, before)
	}

	want := errors.New("boom")
	if err := netns.Do(ns.File, func() error { return want }); !errors.Is(err, want) {
		t.Fatalf("Do returned %v, want fn's error", err)
	}
	ran := false
	if err := netns.Do(nil, func() error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Do(nil) = %v, ran=%v", err, ran)
	}
}

func TestDoRefusesAFileThatIsNotANamespace(t *testing.T) {
	nettest.RequirePrivileged(t)
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ran := false
	if err := netns.Do(f, func() error { ran = true; return nil }); err == nil || ran {
		t.Fatalf("Do with a non-namespace file = %v, ran=%v", err, ran)
	}
}
