package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	be "encoding/binary"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// upgradeMAC is the source MAC of the upgrade tests' frames (ethFrame): the
// attachment's, as its ADD was given it.
const upgradeMAC = "02:00:00:00:00:01"

// TestATapOfThePreviousReleaseIsBoundAtTakeoverWithNoADD is issue 49's
// item 3. The previous release's plugin, run by a runtime through libcni
// (which caches what it ran ADD with, as containerd does), makes a tap
// whose attachment has a MAC and addresses; the previous daemon runs it.
// This build's daemon takes it over with no ADD: its rules must bind the
// attachment to that MAC and those addresses from the first pass, so a
// frame from another address is spoofed and not delivered, and this
// build's CHECK of the same attachment passes. A second tap, made with no
// runtime's record, stays as it was and is named unbound (taps, status,
// metric) until an ADD binds it.
func TestATapOfThePreviousReleaseIsBoundAtTakeoverWithNoADD(t *testing.T) {
	oldDaemon, oldPlugin := previousBuild(t)
	nettest.RequireTCX(t)
	h := &cniHost{t: t, host: nettest.NewNS(t), ctr: nettest.NewNS(t), bpffs: nettest.BPFFS(t), dataDir: filepath.Join(t.TempDir(), "cni-state"), plugin: oldPlugin}
	n := newNodeOn(t, h.host, h.bpffs)
	h.locks = filepath.Join(n.dir, "locks")
	inventory := n.writeInventory(
		"apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: att-b, namespace: t}\nstatus: {vpc: a, vpcAttachment: \"b\"}\n",
		"apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: att-c, namespace: t}\nstatus: {vpc: a, vpcAttachment: \"c\"}\n")
	common := []string{"--node-name", "node-a", "--interval", "0", "--bpffs", h.bpffs, "--vrf-lock-dir", h.locks, "--inventory-file", inventory,
		"--admin-socket", n.socket, "--admin-token-file", n.tokens, "--metrics-listen", "", "--log-format", "text"}
	nettest.Run(t, "ip", "netns", "exec", h.host.Name, "sysctl", "-qw", "net.ipv4.conf.all.forwarding=1")

	// A runtime: libcni with its cache, running a plugin build.
	cache := t.TempDir()
	runtimeOf := func(plugin string) *libcni.CNIConfig {
		bin := t.TempDir()
		if err := os.Symlink(plugin, filepath.Join(bin, "galactic-tap")); err != nil {
			t.Fatal(err)
		}
		return libcni.NewCNIConfigWithCacheDir([]string{bin}, cache, &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: testLog{t}}})
	}
	var tapConf map[string]any
	if err := json.Unmarshal(h.conf("b", map[string]any{"mac": upgradeMAC}), &tapConf); err != nil {
		t.Fatal(err)
	}
	delete(tapConf, "cniVersion")
	delete(tapConf, "name")
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "galactic", "plugins": []any{tapConf}})
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	ctr := strings.Repeat("b", 64)
	rt := &libcni.RuntimeConf{ContainerID: ctr, NetNS: "/run/netns/" + h.ctr.Name, IfName: "net1"}
	inHost := func(fn func(ctx context.Context) error) error {
		r := &runtime{h: h}
		return r.in(fn)
	}

	d := startDaemon(t, n, oldDaemon, common...)
	old := runtimeOf(oldPlugin)
	if err := inHost(func(ctx context.Context) error { _, err := old.AddNetworkList(ctx, list, rt); return err }); err != nil {
		t.Fatalf("the previous release's ADD through libcni: %v", err)
	}
	h.mustCNI("ADD", strings.Repeat("c", 64), h.conf("c", nil)) // no runtime's record of it
	bound, ok := h.link(tapName("b"))
	unbound, ok2 := h.link(tapName("c"))
	if !ok || !ok2 {
		t.Fatal("the previous release made no taps")
	}
	d.stop(t)

	h.plugin = tapPlugin
	d = startDaemon(t, n, binary, append(slices.Clone(common), "--cni-data-dir", h.dataDir, "--cni-cache-dirs", cache)...)
	defer d.stop(t)

	dp, err := datapath.OpenPinned(h.bpffs)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	rules, err := dp.TapRules.Get(bound.Index)
	if err != nil {
		t.Fatal(err)
	}
	if rules.Unbound || rules.Policy.AllowSpoofing || len(rules.Prefixes) == 0 || net.HardwareAddr(rules.MAC).String() != upgradeMAC {
		t.Fatalf("tap %s's rules after the takeover: %+v, want bound to %s and its routes, anti-spoofing on; the daemon said:\n%s", tapName("b"), rules, upgradeMAC, d.log)
	}

	// A frame from another address is spoofed, and one from its own passes.
	q := openQueue(t, h, tapName("b"))
	defer q.Close()
	id, _ := identity.ParseBase62("a", "b")
	spoofed := countOf(t, h.bpffs, id, datapath.DecisionSpoofed)
	allowed := countOf(t, h.bpffs, id, datapath.DecisionAllow)
	if _, err := q.Write(udp4Frame(uint16(id.Attachment)+1, nil, "10.9.0.1", 9999)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Write(udp4Frame(uint16(id.Attachment), nil, "10.9.0.1", 9999)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the frames judged", func() (bool, string) {
		s, a := countOf(t, h.bpffs, id, datapath.DecisionSpoofed), countOf(t, h.bpffs, id, datapath.DecisionAllow)
		return s == spoofed+1 && a == allowed+1, fmt.Sprintf("spoofed %d (was %d), allowed %d (was %d); every count: %s", s, spoofed, a, allowed, countsOf(t, h.bpffs, id))
	})

	// This build's CHECK, through libcni, of the attachment the old ADD made.
	current := runtimeOf(tapPlugin)
	if err := inHost(func(ctx context.Context) error { return current.CheckNetworkList(ctx, list, rt) }); err != nil {
		t.Fatalf("CHECK of the taken-over attachment: %v", err)
	}

	// The tap no record speaks for stays unbound, and says so.
	if r, err := dp.TapRules.Get(unbound.Index); err != nil || !r.Unbound || !r.Policy.AllowSpoofing {
		t.Fatalf("tap %s's rules: %+v %v, want unbound with anti-spoofing off", tapName("c"), r, err)
	}
	var st struct {
		Unbound struct {
			Count int      `json:"count"`
			Taps  []string `json:"taps"`
		} `json:"unbound"`
	}
	code, body := n.call(http.MethodGet, "/v1/status", readToken)
	if err := json.Unmarshal(body, &st); code != http.StatusOK || err != nil || st.Unbound.Count != 1 || !slices.Equal(st.Unbound.Taps, []string{tapName("c")}) {
		t.Fatalf("status after the takeover: %d %s, want one unbound tap, %s", code, body, tapName("c"))
	}
	var taps struct {
		Items []struct {
			Name    string `json:"name"`
			Unbound bool   `json:"unbound"`
		} `json:"items"`
	}
	code, body = n.call(http.MethodGet, "/v1/taps", readToken)
	if err := json.Unmarshal(body, &taps); code != http.StatusOK || err != nil {
		t.Fatalf("taps: %d %s", code, body)
	}
	for _, v := range taps.Items {
		if v.Unbound != (v.Name == tapName("c")) {
			t.Errorf("taps says %s unbound=%v", v.Name, v.Unbound)
		}
	}
	// An ADD of this build binds it.
	h.mustCNI("ADD", strings.Repeat("c", 64), h.conf("c", nil))
	code, body = n.call(http.MethodGet, "/v1/status", readToken)
	if err := json.Unmarshal(body, &st); code != http.StatusOK || err != nil || st.Unbound.Count != 0 {
		t.Fatalf("status after an ADD of the unbound tap: %d %s, want none unbound", code, body)
	}
}

// countOf reads id's count of decision d from the pinned decisions map.
// countsOf names every decision id has a count of, for a failure's message:
// a frame judged otherwise than a test expects shows where it went.
func countsOf(t *testing.T, bpffs string, id identity.Identity) string {
	t.Helper()
	var out []string
	for d := range datapath.Decision(16) {
		if n := countOf(t, bpffs, id, d); n > 0 {
			out = append(out, fmt.Sprintf("%s %d", d, n))
		}
	}
	return strings.Join(out, ", ")
}

func countOf(t *testing.T, bpffs string, id identity.Identity, d datapath.Decision) uint64 {
	t.Helper()
	decisions, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, datapath.PinSubdir, "decisions"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer decisions.Close()
	key := make([]byte, 16)
	be.NativeEndian.PutUint64(key, uint64(id.VPC))
	be.NativeEndian.PutUint16(key[8:], uint16(id.Attachment))
	key[10] = byte(d)
	var n uint64
	if err := decisions.Lookup(key, &n); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatal(err)
	}
	return n
}
