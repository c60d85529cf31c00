package integration

import (
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// A tap is single-queue unless its network asks for queues: the kernel
// gives every multiqueue tun device 256 transmit queues, each with its own
// kernel objects, whatever the VMM attaches (docs/scale.md). A network
// that asks gets a multiqueue tap, and one that asks both ways is refused.
func TestATapIsSingleQueueUnlessTheNetworkAsks(t *testing.T) {
	h := newCNIHost(t)
	for _, c := range []struct {
		att   string
		extra map[string]any
		multi bool
	}{
		{"s", nil, false},
		{"t", map[string]any{"singleQueue": true}, false},
		{"m", map[string]any{"multiQueue": true}, true},
	} {
		h.mustCNI("ADD", ctrA, h.conf(c.att, c.extra))
		l, ok := h.link(tapName(c.att))
		if !ok {
			t.Fatalf("%v: no tap", c.extra)
		}
		tp, _ := l.AsTap()
		if tp.Tun.MultiQueue != c.multi {
			t.Errorf("config %v: multiqueue %v, want %v", c.extra, tp.Tun.MultiQueue, c.multi)
		}
		out := nettest.Run(t, "tc", "-n", h.host.Name, "qdisc", "show", "dev", tapName(c.att))
		if !strings.Contains(out, "qdisc noqueue") {
			t.Errorf("config %v: qdiscs\n%s", c.extra, out)
		}
	}
	res, err := h.cni("ADD", ctrA, h.conf("b", map[string]any{"multiQueue": true, "singleQueue": true}))
	if err == nil || res.Code != 7 {
		t.Fatalf("both queue modes: code %d, err %v", res.Code, err)
	}
	if _, ok := h.link(tapName("b")); ok {
		t.Fatal("a refused ADD made a tap")
	}
}
