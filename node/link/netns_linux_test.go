package link_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// NetNS names the namespace a connection was dialled in, as readlink of
// /proc/self/ns/net names it, also when the caller is elsewhere.
func TestNetNSNamesTheConnectionsNamespace(t *testing.T) {
	ns := nettest.NewNS(t)
	fi, err := ns.File.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ns.Dial(t).NetNS(); err != nil || got != fmt.Sprintf("net:[%d]", nettest.Inode(fi)) {
		t.Fatalf("NetNS in %s: %q, %v; want inode %d", ns.Name, got, err, nettest.Inode(fi))
	}
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	c, err := link.Dial(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got, err := c.NetNS(); err != nil || got != own {
		t.Fatalf("NetNS of a connection dialled here: %q, %v; want %q", got, err, own)
	}
}
