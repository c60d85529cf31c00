package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// In a chain after a plugin that gives the pod its addresses (bridge with
// host-local here), ADD's result keeps what came before and adds the tap: a
// runtime keeps only the last plugin's result, so dropping the chain's
// would drop the pod's IPs.
func TestAddPassesThePreviousResultOn(t *testing.T) {
	h := newCNIHost(t)
	r := newRuntime(t, h)
	bridge := map[string]any{"type": "bridge", "bridge": "chainbr0", "isGateway": true,
		"ipam": map[string]any{"type": "host-local", "subnet": "10.98.0.0/24", "dataDir": filepath.Join(t.TempDir(), "host-local")}}
	l := r.list("1.1.0", "chained", "c")
	// bridge first, galactic-tap after it.
	var tap map[string]any
	_ = json.Unmarshal(l.Plugins[0].Bytes, &tap)
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "chained", "plugins": []any{bridge, tap}})
	list := mustConfList(t, b)
	var res *current.Result
	err := r.in(func(ctx context.Context) error {
		out, err := r.cni.AddNetworkList(ctx, list, r.rt(ctrA, "eth0"))
		if err != nil {
			return err
		}
		res, err = current.NewResultFromResult(out)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || !strings.HasPrefix(res.IPs[0].Address.String(), "10.98.0.") {
		t.Fatalf("the chain's result lost the pod's address: %+v", res)
	}
	names := map[string]bool{}
	for _, i := range res.Interfaces {
		names[i.Name] = true
	}
	if !names["chainbr0"] || !names["eth0"] || !names[tapName("c")] {
		t.Fatalf("the chain's result names interfaces %v, want the bridge's and the tap", names)
	}
	if err := r.in(func(ctx context.Context) error { return r.cni.CheckNetworkList(ctx, list, r.rt(ctrA, "eth0")) }); err != nil {
		t.Fatalf("CHECK of the chain: %v", err)
	}
	if err := r.in(func(ctx context.Context) error { return r.cni.DelNetworkList(ctx, list, r.rt(ctrA, "eth0")) }); err != nil {
		t.Fatal(err)
	}
}

// DEL succeeds when there is nothing to remove, whatever else is wrong: the
// daemon's maps are not pinned (it has not started yet), or the identity in
// the configuration no longer parses. Otherwise the runtime can never stop
// the sandbox.
func TestDelSucceedsWhenThereIsNothingToRemove(t *testing.T) {
	h := newCNIHost(t)
	r := newRuntime(t, h)
	unpinned := nettest.BPFFS(t) // a bpffs where no daemon pinned anything
	del := func(extra map[string]any, container string) error {
		var c map[string]any
		_ = json.Unmarshal(h.conf("d", extra), &c)
		delete(c, "cniVersion")
		delete(c, "name")
		b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "galactic", "plugins": []any{c}})
		return r.in(func(ctx context.Context) error {
			return r.cni.DelNetworkList(ctx, mustConfList(t, b), r.rt(container, "eth0"))
		})
	}
	if err := del(map[string]any{"bpffs": unpinned}, ctrA); err != nil {
		t.Fatalf("DEL with no maps pinned and no tap: %v", err)
	}
	if err := del(map[string]any{"vpcAttachment": "not base62!"}, ctrA); err != nil {
		t.Fatalf("DEL with an identity that does not parse: %v", err)
	}

	// With a tap of this attachment there is something to remove: with no
	// maps DEL says so (try again once the daemon is up) and leaves it; a
	// broken identity still removes what this attachment recorded.
	h.mustCNI("ADD", ctrA, h.conf("d", nil))
	if err := del(map[string]any{"bpffs": unpinned}, ctrA); cniCode(err) != 50 {
		t.Fatalf("DEL of a live tap with no maps pinned: %v, want code 50", err)
	}
	if _, ok := h.link(tapName("d")); !ok {
		t.Fatal("DEL with no maps removed the tap")
	}
	l, _ := h.link(tapName("d"))
	if err := del(map[string]any{"vpcAttachment": "not base62!"}, ctrA); err != nil {
		t.Fatalf("DEL with an identity that does not parse: %v", err)
	}
	if _, ok := h.link(tapName("d")); ok || len(h.rows(l.Index)) != 0 {
		t.Fatal("DEL by this attachment's record left the tap or its rows")
	}
}

// DEL removes the tap even when the pinned maps are of another layout than
// this plugin's (an upgrade whose daemon refuses them, after its init
// container installed this plugin), and leaves the rows to the orphan
// collection of a daemon that can read them: otherwise no pod on the node
// could ever be deleted, and the remedy, draining the node's taps, needs the
// DEL that fails (issue 30). ADD and CHECK still refuse, naming the map.
func TestDelRemovesTheTapWhenThePinnedLayoutDiffers(t *testing.T) {
	h := newCNIHost(t)
	h.mustCNI("ADD", ctrA, h.conf("d", nil))
	l, ok := h.link(tapName("d"))
	if !ok {
		t.Fatal("ADD made no tap")
	}

	// Another bpffs whose pins are this build's but one, of another
	// layout: the maps as an older or newer daemon left them.
	other := nettest.BPFFS(t)
	dp, err := datapath.Load(other)
	if err != nil {
		t.Fatal(err)
	}
	dp.Close()
	pin := filepath.Join(other, datapath.PinSubdir, "traffic_policy")
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: "traffic_policy", Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}
	conf := h.conf("d", map[string]any{"bpffs": other})

	if _, err := h.cni("CHECK", ctrA, conf); err == nil || !strings.Contains(err.Error(), "traffic_policy") {
		t.Errorf("CHECK over pins of another layout: %v, want an error naming traffic_policy", err)
	}
	if _, err := h.cni("DEL", ctrA, conf); err != nil {
		t.Fatalf("DEL over pins of another layout: %v", err)
	}
	if _, ok := h.link(tapName("d")); ok {
		t.Fatal("DEL over pins of another layout left the tap")
	}
	// The rows it could not open stay, for the orphan collection.
	if len(h.rows(l.Index)) == 0 {
		t.Error("the rows in the maps DEL could not open are gone")
	}
	if _, err := h.cni("DEL", ctrA, conf); err != nil {
		t.Fatalf("DEL again: %v", err)
	}
}

func mustConfList(t *testing.T, b []byte) *libcni.NetworkConfigList {
	t.Helper()
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
