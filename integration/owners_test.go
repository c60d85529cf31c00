package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// networkNamed is the galactic conflist for attachment att under another
// network name, as a second NetworkAttachmentDefinition would give it.
func (r *runtime) networkNamed(name, att string) *libcni.NetworkConfigList {
	return r.list("1.1.0", name, att)
}

// cniCode is the CNI error code of err, or 0.
func cniCode(err error) uint {
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code
	}
	return 0
}

// One pod attached to two networks that name the same identity gets one
// tap, owned by the first network's attachment: the second ADD is refused
// (as host-local refuses an address in use), the runtime's DEL that follows
// the failed ADD leaves the tap, its rows and its routes, and only the
// owner's DEL removes it.
func TestOneTapHasOneOwnerAcrossNetworks(t *testing.T) {
	h := newCNIHost(t)
	r := newRuntime(t, h)
	net1, net2 := r.networkNamed("net1", "o"), r.networkNamed("net2", "o")
	in := func(fn func(ctx context.Context) error) error { return r.in(fn) }
	if err := in(func(ctx context.Context) error {
		_, err := r.cni.AddNetworkList(ctx, net1, r.rt(ctrA, "net1"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	l, _ := h.link(tapName("o"))
	rows := h.rows(l.Index)
	err := in(func(ctx context.Context) error {
		_, err := r.cni.AddNetworkList(ctx, net2, r.rt(ctrA, "net2"))
		return err
	})
	if cniCode(err) != 100 || !strings.Contains(err.Error(), `network "net1"`) {
		t.Fatalf("the second network's ADD of the same identity: %v (code %d), want code 100 naming net1", err, cniCode(err))
	}
	// The runtime cleans up the failed attachment.
	if err := in(func(ctx context.Context) error { return r.cni.DelNetworkList(ctx, net2, r.rt(ctrA, "net2")) }); err != nil {
		t.Fatalf("DEL of the refused attachment: %v", err)
	}
	if after, ok := h.link(tapName("o")); !ok || after.Index != l.Index {
		t.Fatal("DEL of net2 removed net1's tap")
	}
	if got := h.rows(l.Index); len(got) != len(rows) {
		t.Fatalf("rows after net2's ADD and DEL: %v, want %v", got, rows)
	}
	if err := in(func(ctx context.Context) error { return r.cni.CheckNetworkList(ctx, net1, r.rt(ctrA, "net1")) }); err != nil {
		t.Fatalf("CHECK of net1 after net2's attempt: %v", err)
	}
	if err := in(func(ctx context.Context) error { return r.cni.DelNetworkList(ctx, net1, r.rt(ctrA, "net1")) }); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.link(tapName("o")); ok {
		t.Fatal("the owner's DEL left the tap")
	}
}

// sandboxNS is a runtime sandbox's namespace path, torn down by remove
// (as the runtime does when it removes the sandbox) or when t ends.
func sandboxNS(t *testing.T) (path string, remove func()) {
	t.Helper()
	name := "galactic-sbx-" + strings.ReplaceAll(t.Name(), "/", "-")
	if len(name) > 60 {
		name = name[:60]
	}
	nettest.Run(t, "ip", "netns", "add", name)
	remove = func() { _ = exec.Command("ip", "netns", "del", name).Run() }
	t.Cleanup(remove)
	return "/run/netns/" + name, remove
}

// Another container may not take a tap over while the sandbox that
// recorded it still exists, even when nothing holds the tap (a VM pod
// before its VMM starts); once the runtime has removed that sandbox without
// a DEL, the new container takes it over.
func TestATapIsNotTakenFromALiveSandbox(t *testing.T) {
	h := newCNIHost(t)
	r := newRuntime(t, h)
	list := r.list("1.1.0", "galactic", "p")
	first, removeFirst := sandboxNS(t)
	second := strings.Repeat("b", 64)
	add := func(container, netns string) error {
		rt := r.rt(container, "eth0")
		rt.NetNS = netns
		return r.in(func(ctx context.Context) error { _, err := r.cni.AddNetworkList(ctx, list, rt); return err })
	}
	if err := add(ctrA, first); err != nil {
		t.Fatal(err)
	}
	err := add(second, "/run/netns/"+h.ctr.Name)
	if cniCode(err) != 100 || !strings.Contains(err.Error(), first) {
		t.Fatalf("ADD of another container while the first sandbox lives: %v (code %d), want code 100 naming %s", err, cniCode(err), first)
	}
	if l, _ := h.link(tapName("p")); l.Alias != ctrA {
		t.Fatalf("the refused ADD restamped the tap: %q", l.Alias)
	}
	removeFirst()
	if err := add(second, "/run/netns/"+h.ctr.Name); err != nil {
		t.Fatalf("ADD after the first sandbox is gone: %v", err)
	}
	if l, _ := h.link(tapName("p")); l.Alias != second {
		t.Fatalf("after the takeover the tap is stamped %q", l.Alias)
	}
}

// Multus runs every delegate of a pod with one CNI_ARGS, so each network
// names its identity in its own config's args.cni, which wins over
// CNI_ARGS: one pod in two networks gets each network's tap, and each DEL
// removes only its own.
func TestEachNetworkNamesItsIdentityInArgsCNI(t *testing.T) {
	h := newCNIHost(t)
	r := newRuntime(t, h)
	withArgs := func(name, att string) *libcni.NetworkConfigList {
		var c map[string]any
		_ = json.Unmarshal(h.conf(att, nil), &c)
		delete(c, "cniVersion")
		delete(c, "name")
		delete(c, "vpcAttachment")
		c["args"] = map[string]any{"cni": map[string]any{"GALACTIC_VPC": "a", "GALACTIC_VPC_ATTACHMENT": att, "GALACTIC_TABLE": 1010}}
		b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": []any{c}})
		l, err := libcni.ConfListFromBytes(b)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	nets := map[string]*libcni.NetworkConfigList{"u": withArgs("net-u", "u"), "v": withArgs("net-v", "v")}
	rt := func(ifName string) *libcni.RuntimeConf {
		c := r.rt(ctrA, ifName)
		// What Multus passes every delegate: the pod's, naming neither.
		c.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAME", "vm-1"}, {"GALACTIC_VPC_ATTACHMENT", "w"}}
		return c
	}
	for att, list := range nets {
		if err := r.in(func(ctx context.Context) error { _, err := r.cni.AddNetworkList(ctx, list, rt("net-"+att)); return err }); err != nil {
			t.Fatalf("ADD %s: %v", list.Name, err)
		}
	}
	for _, att := range []string{"u", "v"} {
		if _, ok := h.link(tapName(att)); !ok {
			t.Fatalf("no tap for %s's identity", att)
		}
	}
	if _, ok := h.link(tapName("w")); ok {
		t.Fatal("CNI_ARGS won over the network's own args.cni")
	}
	if err := r.in(func(ctx context.Context) error { return r.cni.DelNetworkList(ctx, nets["u"], rt("net-u")) }); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.link(tapName("u")); ok {
		t.Fatal("DEL of net-u left its tap")
	}
	if _, ok := h.link(tapName("v")); !ok {
		t.Fatal("DEL of net-u removed net-v's tap")
	}
}
