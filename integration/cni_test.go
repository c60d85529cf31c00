package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/node/tun/holder"
	"github.com/datum-cloud/galactic-node/node/vrf"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// cniHost is a host network namespace where the plugin binary runs over
// the CNI protocol, with its own bpffs and lock folder, and a container
// namespace for CNI_NETNS.
type cniHost struct {
	t         testing.TB
	host, ctr *nettest.NS
	bpffs     string
	locks     string
	dataDir   string
	plugin    string // the plugin binary; empty: this build's
}

// newCNIHost makes the scene with the node daemon's pins in place, as the
// plugin requires (it never creates maps itself), and its lock folder.
func newCNIHost(t testing.TB) *cniHost {
	nettest.RequireTCX(t) // ADD attaches the datapath program
	h := &cniHost{t: t, host: nettest.NewNS(t), ctr: nettest.NewNS(t), bpffs: nettest.BPFFS(t),
		locks: filepath.Join(t.TempDir(), "locks"), dataDir: filepath.Join(t.TempDir(), "cni-state")}
	dp, err := datapath.Load(h.bpffs) // stands in for the daemon, which pins the maps
	if err != nil {
		t.Fatal(err)
	}
	dp.Close()
	if err := os.MkdirAll(h.locks, 0o700); err != nil {
		t.Fatal(err)
	}
	return h
}

type cniResult struct {
	Interfaces []struct {
		Name string `json:"name"`
		Mac  string `json:"mac"`
	} `json:"interfaces"`
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details"`
}

func (h *cniHost) conf(att string, extra map[string]any) []byte {
	c := map[string]any{
		"cniVersion": "1.1.0", "name": "galactic", "type": "galactic-tap",
		"vpc": "a", "vpcAttachment": att, "table": 1010,
		"master":  "bridge", // no VRF in this kernel: the bridge stands in
		"routes":  routesOf(att),
		"gateway": map[string]string{"ipv4": "10.10.0.254"}, "hostOnlyPorts": []string{"udp/53"},
		"bpffs": h.bpffs, "vrfLockDir": h.locks, "dataDir": h.dataDir,
	}
	for k, v := range extra {
		c[k] = v
	}
	b, _ := json.Marshal(c)
	return b
}

// routesOf derives an attachment's routes from its identifier.
func routesOf(att string) []string {
	id, err := identity.ParseBase62("a", att)
	if err != nil {
		return nil
	}
	n := uint16(id.Attachment)
	return []string{fmt.Sprintf("10.10.%d.%d/32", n>>8, n&0xff), fmt.Sprintf("fd00:a::%x/128", n)}
}

// cni runs one plugin command as a runtime would.
func (h *cniHost) cni(command, container string, conf []byte) (cniResult, error) {
	h.t.Helper()
	cmd := h.command(command, container, conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var res cniResult
	if stdout.Len() > 0 {
		_ = json.Unmarshal(stdout.Bytes(), &res)
	}
	if err != nil {
		return res, fmt.Errorf("%s %s: %w: code %d %s %s (stderr %s)", command, container, err, res.Code, res.Msg, res.Details, stderr.String())
	}
	return res, nil
}

// command is the built plugin run as a runtime runs it, in the host
// namespace (ip netns exec execs it: its PID is the plugin's).
func (h *cniHost) command(command, container string, conf []byte) *exec.Cmd {
	plugin := tapPlugin
	if h.plugin != "" {
		plugin = h.plugin
	}
	cmd := exec.Command("ip", "netns", "exec", h.host.Name, plugin)
	cmd.Env = []string{"CNI_COMMAND=" + command, "CNI_CONTAINERID=" + container, "CNI_NETNS=/run/netns/" + h.ctr.Name,
		"CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin = bytes.NewReader(conf)
	return cmd
}

func (h *cniHost) mustCNI(command, container string, conf []byte) cniResult {
	h.t.Helper()
	res, err := h.cni(command, container, conf)
	if err != nil {
		h.t.Fatal(err)
	}
	return res
}

func (h *cniHost) link(name string) (link.Link, bool) {
	h.t.Helper()
	l, err := h.host.Dial(h.t).GetByName(context.Background(), name)
	if errors.Is(err, link.ErrLinkGone) {
		return link.Link{}, false
	}
	if err != nil {
		h.t.Fatal(err)
	}
	return l, true
}

var counterMaps = map[string]bool{"decisions": true, "unattributed": true}

func (h *cniHost) rows(ifindex uint32) map[string]int {
	h.t.Helper()
	return nettest.PinnedRowsKeyedBy(h.t, filepath.Join(h.bpffs, datapath.PinSubdir), ifindex, counterMaps)
}

func (h *cniHost) routes(name string) int {
	out := nettest.Run(h.t, "ip", "-n", h.host.Name, "-6", "route", "show", "table", "all") +
		nettest.Run(h.t, "ip", "-n", h.host.Name, "-4", "route", "show", "table", "all")
	return strings.Count(out, "dev "+name)
}

func tapName(att string) string {
	id, _ := identity.ParseBase62("a", att)
	return id.TapName()
}

const ctrA = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestAddCheckDelLeavesNothingBehind(t *testing.T) {
	h := newCNIHost(t)
	conf := h.conf("1", nil)
	res := h.mustCNI("ADD", ctrA, conf)
	if len(res.Interfaces) != 1 || res.Interfaces[0].Name != tapName("1") || res.Interfaces[0].Mac == "" {
		t.Fatalf("ADD result: %+v", res)
	}
	l, ok := h.link(tapName("1"))
	if !ok || l.Alias != ctrA || h.routes(l.Name) != 2 || len(h.rows(l.Index)) < 4 {
		t.Fatalf("after ADD: link %+v routes %d rows %v", l, h.routes(l.Name), h.rows(l.Index))
	}
	h.mustCNI("CHECK", ctrA, conf)
	h.mustCNI("DEL", ctrA, conf)
	if _, ok := h.link(tapName("1")); ok {
		t.Fatal("the tap survived DEL")
	}
	if n := h.routes(l.Name); n != 0 {
		t.Fatalf("%d routes survived DEL", n)
	}
	if rows := h.rows(l.Index); len(rows) != 0 {
		t.Fatalf("rows survived DEL: %v", rows)
	}
	h.mustCNI("DEL", ctrA, conf) // idempotent
	h.mustCNI("DEL", ctrA, []byte(`{"cniVersion":"1.1.0","name":"galactic","type":"galactic-tap","bpffs":"`+h.bpffs+`","vrfLockDir":"`+h.locks+`","dataDir":"`+h.dataDir+`"}`))
	if _, err := h.cni("CHECK", ctrA, conf); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("CHECK after DEL: %v", err)
	}
}

// Another container can neither delete a tap nor take it while something
// holds it; ADD's error names the holder.
func TestAnotherContainerCanNeitherDeleteNorTakeAHeldTap(t *testing.T) {
	h := newCNIHost(t)
	conf := h.conf("2", nil)
	h.mustCNI("ADD", ctrA, conf)
	l, _ := h.link(tapName("2"))
	before := h.rows(l.Index)

	other := strings.Repeat("b", 64)
	h.mustCNI("DEL", other, conf)
	if after, ok := h.link(tapName("2")); !ok || after.Index != l.Index || len(h.rows(l.Index)) != len(before) {
		t.Fatal("DEL from another container removed the tap or its rows")
	}
	vmm := nettest.Hold(t, h.host, tapName("2"), nettest.HoldOptions{Mode: tunMode()})
	_, err := h.cni("ADD", other, conf)
	if err == nil || !strings.Contains(err.Error(), "code 100") || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", vmm.PID())) {
		t.Fatalf("ADD over another container's held tap: %v, want error 100 naming pid %d", err, vmm.PID())
	}
	if after, _ := h.link(tapName("2")); after.Alias != ctrA || len(h.rows(l.Index)) != len(before) {
		t.Fatal("a refused ADD changed the tap or its rows")
	}
	if _, err := h.cni("CHECK", other, conf); err == nil || !strings.Contains(err.Error(), "stamped") {
		t.Fatalf("CHECK by another container: %v", err)
	}
	res := h.mustCNI("ADD", ctrA, conf) // the same container again: adopted
	if again, _ := h.link(tapName("2")); again.Index != l.Index || res.Interfaces[0].Name != l.Name {
		t.Fatal("a repeated ADD re-created the tap instead of adopting it")
	}
	h.mustCNI("CHECK", ctrA, conf)
}

// A container whose DEL never ran leaves a tap stamped for an identity that
// is still live; the next container's ADD for that identity takes it over
// once nothing holds it: restamped, its rows registered again.
func TestAReturningAttachmentTakesOverAnUnheldTap(t *testing.T) {
	h := newCNIHost(t)
	conf := h.conf("b", nil)
	h.mustCNI("ADD", ctrA, conf)
	l, _ := h.link(tapName("b"))
	if err := datapathTables(h).TrafficPolicy.Delete(l.Index); err != nil { // rows half gone with the old sandbox
		t.Fatal(err)
	}
	next := strings.Repeat("e", 64)
	h.mustCNI("ADD", next, conf)
	after, ok := h.link(tapName("b"))
	if !ok || after.Index != l.Index || after.Alias != next {
		t.Fatalf("after the takeover: %+v, want ifindex %d stamped %s", after, l.Index, next)
	}
	if rows := h.rows(l.Index); rows["traffic_policy"] != 1 {
		t.Fatalf("the takeover did not register the rows again: %v", rows)
	}
	h.mustCNI("CHECK", next, conf)
}

// datapathTables opens the scene's pinned maps.
func datapathTables(h *cniHost) *datapath.Datapath {
	h.t.Helper()
	dp, err := datapath.OpenPinned(h.bpffs)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { dp.Close() })
	return dp
}

func TestBadConfigurationIsRefusedAndChangesNothing(t *testing.T) {
	h := newCNIHost(t)
	for name, conf := range map[string][]byte{
		"not json":        []byte("{"),
		"no identity":     h.conf("", map[string]any{"vpc": ""}),
		"bad identity":    h.conf("!", nil),
		"bad route":       h.conf("3", map[string]any{"routes": []string{"ten.0.0.0/8"}}),
		"bad host port":   h.conf("3", map[string]any{"hostOnlyPorts": []string{"icmp/1"}}),
		"bad master":      h.conf("3", map[string]any{"master": "team"}),
		"bad action":      h.conf("3", map[string]any{"policy": map[string]any{"defaultAction": "maybe"}}),
		"table 0":         h.conf("3", map[string]any{"table": 0}),
		"gateway family":  h.conf("3", map[string]any{"gateway": map[string]string{"ipv4": "fd00::1"}}),
		"group mac":       h.conf("3", map[string]any{"mac": "01:00:5e:00:00:01"}),
		"bad runtime mac": h.conf("3", map[string]any{"runtimeConfig": map[string]any{"mac": "02:00"}}),
		"bad runtime ip":  h.conf("3", map[string]any{"runtimeConfig": map[string]any{"ips": []string{"10.0.0.300/24"}}}),
		"five ipv4 addresses": h.conf("3", map[string]any{"runtimeConfig": map[string]any{
			"ips": []string{"10.0.0.1/24", "10.0.0.2/24", "10.0.0.3/24", "10.0.0.4/24", "10.0.0.5/24"}}}),
	} {
		if _, err := h.cni("ADD", ctrA, conf); err == nil {
			t.Errorf("%s: ADD succeeded", name)
		} else if !strings.Contains(err.Error(), "code 7") && !strings.Contains(err.Error(), "code 6") && name != "table 0" {
			t.Errorf("%s: %v, want CNI error 6 (decoding) or 7 (invalid configuration)", name, err)
		}
	}
	links, err := h.host.Dial(t).Links(context.Background())
	if err != nil || len(links) != 1 {
		t.Fatalf("links after refused ADDs: %d %v, want only lo", len(links), err)
	}
}

// TestAnAttachmentThatWouldBeBlackHoledIsRefused: anti-spoofing on and no
// address (KubeVirt names a definition and fills only "mac") would drop
// every IP packet the VM sends. ADD refuses it with code 7 naming the
// fixes, making nothing; CHECK says the same of such a configuration. An
// address from routes or the "ips" capability, anti-spoofing off, or a
// policy that admits no IP at all is accepted.
func TestAnAttachmentThatWouldBeBlackHoledIsRefused(t *testing.T) {
	h := newCNIHost(t)
	noAddress := map[string]any{"routes": []string{}, "runtimeConfig": map[string]any{"mac": "02:00:0a:0a:00:03"}}
	_, err := h.cni("ADD", ctrA, h.conf("3", noAddress))
	if err == nil {
		t.Fatal("ADD of an attachment without an address succeeded: its VM would have no IP network")
	}
	for _, want := range []string{"code 7", `"routes"`, `"ips"`, `"allowSpoofing": true`, "dropped as spoofed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %s: %v", want, err)
		}
	}
	if links, err := h.host.Dial(t).Links(context.Background()); err != nil || len(links) != 1 {
		t.Fatalf("links after the refused ADD: %d %v, want only lo", len(links), err)
	}
	if recs, _ := filepath.Glob(filepath.Join(h.dataDir, "*", "*")); len(recs) != 0 {
		t.Fatalf("the refused ADD left records %v", recs)
	}
	// No ADD ran before: the maps may not even be pinned yet.
	if dp, err := datapath.OpenPinned(h.bpffs); err == nil {
		rows, err := dp.TapRules.Dump(0)
		dp.Close()
		if err != nil || len(rows) != 0 {
			t.Fatalf("the refused ADD left tap_rules rows %v (%v)", rows, err)
		}
	}

	for name, extra := range map[string]map[string]any{
		"ips capability":    {"routes": []string{}, "runtimeConfig": map[string]any{"ips": []string{"10.10.0.4/24"}}},
		"anti-spoofing off": {"routes": []string{}, "policy": map[string]any{"allowSpoofing": true}},
		"no IP admitted":    {"routes": []string{}, "policy": map[string]any{"ethertypes": []int{0x88cc}}},
	} {
		att := map[string]string{"ips capability": "4", "anti-spoofing off": "5", "no IP admitted": "6"}[name]
		if _, err := h.cni("ADD", strings.Repeat(att, 64), h.conf(att, extra)); err != nil {
			t.Errorf("%s: ADD refused: %v", name, err)
		}
	}

	// A tap made with routes, checked with a configuration that lost them
	// (as a tap an older plugin made without one is checked now).
	h.mustCNI("ADD", ctrA, h.conf("3", nil))
	if _, err := h.cni("CHECK", ctrA, h.conf("3", noAddress)); err == nil || !strings.Contains(err.Error(), "code 7") ||
		!strings.Contains(err.Error(), `"allowSpoofing": true`) {
		t.Fatalf("CHECK of an attachment without an address: %v, want code 7 naming the fixes", err)
	}
}

func TestStatusSaysWhetherThePluginCanWork(t *testing.T) {
	h := newCNIHost(t)
	h.mustCNI("STATUS", "", h.conf("1", nil))
	_, err := h.cni("STATUS", "", h.conf("1", map[string]any{"vrfLockDir": "/proc/galactic-not-writable"}))
	if err == nil || !strings.Contains(err.Error(), "code 50") {
		t.Fatalf("STATUS with an unwritable lock folder: %v, want error 50", err)
	}
}

func TestGCRemovesOnlyWhatNoValidAttachmentAndNoHolderKeeps(t *testing.T) {
	h := newCNIHost(t)
	valid, held, stale := strings.Repeat("1", 64), strings.Repeat("2", 64), strings.Repeat("3", 64)
	h.mustCNI("ADD", valid, h.conf("4", nil))
	h.mustCNI("ADD", held, h.conf("5", nil))
	h.mustCNI("ADD", stale, h.conf("6", nil))
	nettest.NewTap(t, h.host, tapName("7"), tunMode()) // unstamped
	nettest.Hold(t, h.host, tapName("5"), nettest.HoldOptions{Mode: tunMode()})
	staleLink, _ := h.link(tapName("6"))

	conf := h.conf("", map[string]any{"vpc": "", "vpcAttachment": "",
		"cni.dev/valid-attachments": []map[string]string{{"containerID": valid, "ifname": "eth0"}}})
	h.mustCNI("GC", "", conf)
	for _, att := range []string{"4", "5", "7"} {
		if _, ok := h.link(tapName(att)); !ok {
			t.Errorf("GC removed %s", tapName(att))
		}
	}
	if _, ok := h.link(tapName("6")); ok {
		t.Fatal("GC left the stale tap")
	}
	if rows := h.rows(staleLink.Index); len(rows) != 0 {
		t.Fatalf("GC left rows of the stale tap: %v", rows)
	}
	h.mustCNI("GC", "", conf) // nothing left to do
}

// reclaimer runs the node's reclaim in the host namespace against the
// plugin's pins and locks, with a static inventory carrying ids.
func (h *cniHost) reclaimer(ids ...identity.Identity) *reclaim.Reclaimer {
	h.t.Helper()
	objs := []inventory.Object{inventory.AttachmentObject("ns", "live", "zz", "1")}
	for _, id := range ids {
		objs = append(objs, inventory.AttachmentObject("ns", id.TapName(), id.VPC.Base62(), id.Attachment.Base62()))
	}
	dp, err := datapath.Load(h.bpffs)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { dp.Close() })
	locks, err := vrf.NewLocker(h.locks)
	if err != nil {
		h.t.Fatal(err)
	}
	conn := h.host.Dial(h.t)
	// The plugin's taps are single-queue: only the kernel probe proves
	// them free, as the daemon's reclaim does.
	return reclaim.New(conn, &inventory.Static{Objects: objs, Synced: true}, attachreg.New(dp, h.host.File, nil), locks, nil, nil,
		// The brake is off: these scenes hold a few taps, all stale.
		reclaim.Config{Prober: holder.Prober{NS: h.host.File, Links: conn}, MassRemovalShare: 1, InventoryShrinkShare: 1, MaxReclaimsPerPass: -1})
}

// TestConcurrentAddsAndReclaimPassesNeverLoseATap runs 20 ADDs into one VRF
// while reclaim passes run back to back and remove 10 stale taps of the same
// VRF: every ADD's tap survives with its rows, every stale one goes.
func TestConcurrentAddsAndReclaimPassesNeverLoseATap(t *testing.T) {
	h := newCNIHost(t)
	var stale []uint32
	for i := range 10 {
		att := fmt.Sprintf("s%d", i)
		h.mustCNI("ADD", fmt.Sprintf("%064d", 900+i), h.conf(att, nil))
		l, _ := h.link(tapName(att))
		stale = append(stale, l.Index)
	}
	var ids []identity.Identity
	for i := range 20 {
		id, _ := identity.ParseBase62("a", fmt.Sprintf("%d", 100+i))
		ids = append(ids, id)
	}
	r := h.reclaimer(ids...)
	stop := make(chan struct{})
	passes := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				passes <- n
				return
			default:
			}
			r.Pass(context.Background(), reclaim.PassOptions{})
			n++
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := range 20 {
		wg.Go(func() {
			if _, err := h.cni("ADD", fmt.Sprintf("%064d", i), h.conf(fmt.Sprintf("%d", 100+i), nil)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond) // a few more passes after the last ADD
	close(stop)
	n := <-passes
	r.Pass(context.Background(), reclaim.PassOptions{})
	r.Pass(context.Background(), reclaim.PassOptions{})
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d reclaim passes ran during the ADDs", n)
	for i, id := range ids {
		l, ok := h.link(id.TapName())
		if !ok || l.Alias != fmt.Sprintf("%064d", i) {
			t.Errorf("ADD %d's tap %s: present %v stamp %q", i, id.TapName(), ok, l.Alias)
			continue
		}
		if rows := h.rows(l.Index); rows["traffic_policy"] != 1 || rows["ifindex_vrf"] != 1 {
			t.Errorf("ADD %d's tap %s lacks rows: %v", i, id.TapName(), rows)
		}
	}
	for _, idx := range stale {
		if rows := h.rows(idx); len(rows) != 0 {
			t.Errorf("stale ifindex %d keeps rows %v", idx, rows)
		}
	}
	links, _ := h.host.Dial(t).Links(context.Background())
	if taps := link.TenantTaps(links); len(taps) != 20 {
		t.Errorf("%d tenant taps at the end, want the 20 ADDs'", len(taps))
	}
}

// TestReclaimAndGCClearExactlyWhatDelClears: after DEL the reclaim has
// nothing to do; a tap that leaked (ADD, no DEL, attachment gone) is removed
// by the reclaim, and another by GC, each leaving no row of its ifindex in
// any pinned map, as DEL leaves none.
func TestReclaimAndGCClearExactlyWhatDelClears(t *testing.T) {
	h := newCNIHost(t)
	r := h.reclaimer()
	h.mustCNI("ADD", ctrA, h.conf("8", nil))
	deleted, _ := h.link(tapName("8"))
	h.mustCNI("DEL", ctrA, h.conf("8", nil))
	for range 2 {
		if rep := r.Pass(context.Background(), reclaim.PassOptions{}); len(rep.Candidates) != 0 {
			t.Fatalf("the reclaim found work after DEL: %+v", rep.Candidates)
		}
	}
	if rows := h.rows(deleted.Index); len(rows) != 0 {
		t.Fatalf("DEL left rows: %v", rows)
	}

	leaked := strings.Repeat("c", 64)
	h.mustCNI("ADD", leaked, h.conf("9", nil))
	l, _ := h.link(tapName("9"))
	if len(h.rows(l.Index)) < 4 {
		t.Fatal("the leaked tap has no rows to begin with")
	}
	r.Pass(context.Background(), reclaim.PassOptions{})
	if rep := r.Pass(context.Background(), reclaim.PassOptions{}); len(rep.Reclaimed) != 1 {
		t.Fatalf("the reclaim did not remove the leaked tap: %+v", rep)
	}
	if rows := h.rows(l.Index); len(rows) != 0 {
		t.Fatalf("the reclaim left rows: %v", rows)
	}

	leaked2 := strings.Repeat("d", 64)
	h.mustCNI("ADD", leaked2, h.conf("10", nil))
	l2, _ := h.link(tapName("10"))
	h.mustCNI("GC", "", h.conf("", map[string]any{"vpc": "", "vpcAttachment": "", "cni.dev/valid-attachments": []map[string]string{}}))
	if _, ok := h.link(tapName("10")); ok {
		t.Fatal("GC left the leaked tap")
	}
	if rows := h.rows(l2.Index); len(rows) != 0 {
		t.Fatalf("GC left rows: %v", rows)
	}
}

// tunMode is how a VMM opens the plugin's taps: single-queue, its default.
func tunMode() tun.Mode { return tun.Mode{SingleQueue: true} }
