package integration

import (
	"context"
	be "encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// TestInstallCNIRefusesAPluginThatCannotWriteThePins runs the built
// install-cni over the pins and the layout record the built daemon left: a
// plugin of the same layout is installed, one of another is refused with
// the old plugin kept, so a rollout never leaves a node whose every ADD
// fails.
func TestInstallCNIRefusesAPluginThatCannotWriteThePins(t *testing.T) {
	bpffs := nettest.BPFFS(t)
	n := newNodeOn(t, nettest.NewNS(t), bpffs)
	record := filepath.Join(n.dir, "run", "datapath-layout")
	d := n.run(t, "--inventory-file", n.writeInventory(liveAttachment), "--layout-record", record)
	n.ready(t, d)
	b, err := os.ReadFile(record)
	if err != nil {
		t.Fatalf("the daemon recorded no layout: %v", err)
	}
	this, err := datapath.ThisBuildsPins()
	if err != nil {
		t.Fatal(err)
	}
	layout, shape := this.Layout, this.Shape
	if got := strings.TrimSpace(string(b)); got != layout+" "+shape {
		t.Fatalf("the daemon recorded %q, want this build's layout and shape %q", got, layout+" "+shape)
	}
	pins := filepath.Join(bpffs, datapath.PinSubdir)

	const older = "the plugin installed before"
	install := func(t *testing.T, pinDir, record string) (string, string, error) {
		t.Helper()
		netd, bin := hostCNIFolders(t, "")
		if err := os.MkdirAll(bin, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bin, "galactic-tap"), []byte(older), 0o755); err != nil {
			t.Fatal(err)
		}
		log, err := installCNI(t, bin, netd, "--pin-dir", pinDir, "--layout-record", record)
		plugin, rerr := os.ReadFile(filepath.Join(bin, "galactic-tap"))
		if rerr != nil {
			t.Fatal(rerr)
		}
		return log, string(plugin), err
	}

	t.Run("pins of this layout", func(t *testing.T) {
		log, plugin, err := install(t, pins, record)
		if err != nil || plugin == older {
			t.Fatalf("install-cni over pins of its layout: %v, plugin replaced %t\n%s", err, plugin != older, log)
		}
	})
	t.Run("pins of another layout", func(t *testing.T) {
		other := filepath.Join(t.TempDir(), "datapath-layout")
		if err := os.WriteFile(other, []byte("v1-000000000000000000000000\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		log, plugin, err := install(t, pins, other)
		if err == nil {
			t.Fatalf("install-cni installed a plugin of another layout than the pins':\n%s", log)
		}
		if plugin != older {
			t.Error("the refused install replaced the plugin installed before")
		}
		for _, want := range []string{"another layout", pins, "v1-000000000000000000000000"} {
			if !strings.Contains(log, want) {
				t.Errorf("the refusal does not say %q:\n%s", want, log)
			}
		}
	})
	t.Run("pins of another capacity", func(t *testing.T) {
		// The daemon migrates those at start (datapath.Load).
		other := filepath.Join(t.TempDir(), "datapath-layout")
		if err := os.WriteFile(other, []byte("v1-000000000000000000000000 "+shape+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		log, plugin, err := install(t, pins, other)
		if err != nil || plugin == older || !strings.Contains(log, "capacity alone") {
			t.Fatalf("install-cni over pins of another capacity: %v, plugin replaced %t\n%s", err, plugin != older, log)
		}
	})
	t.Run("pins no daemon recorded", func(t *testing.T) {
		log, plugin, err := install(t, pins, filepath.Join(t.TempDir(), "none"))
		if err != nil || plugin == older || !strings.Contains(log, "level=WARN") {
			t.Fatalf("install-cni over pins with no record: %v, plugin replaced %t, want installed with a warning\n%s", err, plugin != older, log)
		}
	})
	t.Run("no pins yet", func(t *testing.T) {
		other := filepath.Join(t.TempDir(), "datapath-layout")
		if err := os.WriteFile(other, []byte("v1-000000000000000000000000\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		log, plugin, err := install(t, filepath.Join(t.TempDir(), "galactic"), other)
		if err != nil || plugin == older {
			t.Fatalf("install-cni on a node with no pins: %v, plugin replaced %t\n%s", err, plugin != older, log)
		}
	})
}

// TestGCRemovesATapMadeBeforeRecordsOnceItsContainerIsGone: a plugin older
// than the records left taps no network recorded (here ADD's, with the
// record removed). The GC of the network whose configuration names a tap's
// identity records it while its container is listed, removes it once the
// container is not, keeps it while a process holds it, and leaves the
// unrecorded taps of other identities alone.
func TestGCRemovesATapMadeBeforeRecordsOnceItsContainerIsGone(t *testing.T) {
	h := newCNIHost(t)
	r := newRuntime(t, h)
	ctr := map[string]string{"7": strings.Repeat("7", 64), "8": strings.Repeat("8", 64), "9": strings.Repeat("9", 64)}
	nets := map[string]*libcni.NetworkConfigList{}
	for att, c := range ctr {
		nets[att] = r.list("1.1.0", "vm-"+att, att)
		// Not through libcni, whose GC would DEL the attachments it
		// cached: the taps of an older plugin are in no cache either.
		h.mustCNI("ADD", c, h.conf(att, map[string]any{"name": "vm-" + att}))
		if err := os.Remove(filepath.Join(h.dataDir, "vm-"+att, tapName(att))); err != nil {
			t.Fatalf("the record of %s: %v", tapName(att), err)
		}
	}
	nettest.Hold(t, h.host, tapName("9"), nettest.HoldOptions{Mode: tunMode()})
	gc := func(att string, valid ...string) {
		t.Helper()
		var list []types.GCAttachment
		for _, c := range valid {
			list = append(list, types.GCAttachment{ContainerID: c, IfName: "eth0"})
		}
		if err := r.in(func(ctx context.Context) error {
			return r.cni.GCNetworkList(ctx, nets[att], &libcni.GCArgs{ValidAttachments: list})
		}); err != nil {
			t.Fatalf("GC of vm-%s: %v", att, err)
		}
	}

	// Its container still listed: recorded, kept.
	gc("7", ctr["7"])
	if _, ok := h.link(tapName("7")); !ok {
		t.Fatal("GC removed a tap made before records whose container it lists")
	}
	if _, err := os.Stat(filepath.Join(h.dataDir, "vm-7", tapName("7"))); err != nil {
		t.Errorf("GC did not record the tap of a container it lists: %v", err)
	}
	// Its container gone: removed, and only it.
	gc("8")
	if _, ok := h.link(tapName("8")); ok {
		t.Fatal("GC left a tap made before records whose container is gone")
	}
	if _, ok := h.link(tapName("7")); !ok {
		t.Fatal("GC of vm-8 removed vm-7's tap")
	}
	// Held: kept, whatever the list says.
	gc("9")
	if _, ok := h.link(tapName("9")); !ok {
		t.Fatal("GC removed a held tap made before records")
	}
	// The adopted tap is an ordinary recorded one from then on.
	gc("7")
	if _, ok := h.link(tapName("7")); ok {
		t.Fatal("GC left the recorded tap once its container was gone")
	}
}

// previousRelease is the recorded commit the upgrade test starts from, the
// release before this one's changes to the datapath: its plugin writes no
// CNI records, its taps have no tap_rules row, and its program lets
// QinQ-tagged frames and IPv6 destination options to an unlisted gateway
// port through. Built from source in the test; the clone needs history.
const previousRelease = "c067dd6afeb25fe83ba5feee123601dd8d580395"

var previous struct {
	once           sync.Once
	daemon, plugin string
	err            error
}

// previousBuild builds previousRelease's daemon and plugin once per run.
func previousBuild(t *testing.T) (daemon, plugin string) {
	t.Helper()
	previous.once.Do(func() {
		dir, err := os.MkdirTemp("", "galactic-previous-")
		if err != nil {
			previous.err = err
			return
		}
		src := filepath.Join(dir, "src")
		if err := os.MkdirAll(src, 0o755); err != nil {
			previous.err = err
			return
		}
		archive := exec.Command("sh", "-c", `git -C .. archive "$1" | tar -x -C "$2"`, "sh", previousRelease, src)
		if out, err := archive.CombinedOutput(); err != nil {
			previous.err = fmt.Errorf("the source of %s (a clone with history is needed): %w: %s", previousRelease, err, out)
			return
		}
		previous.daemon, previous.plugin = filepath.Join(dir, "galactic-node"), filepath.Join(dir, "galactic-tap")
		for bin, pkg := range map[string]string{previous.daemon: "./cmd/galactic-node", previous.plugin: "./cmd/galactic-tap"} {
			cmd := goBuild("-o", bin, pkg)
			cmd.Dir = src
			if out, err := cmd.CombinedOutput(); err != nil {
				previous.err = fmt.Errorf("build %s of %s: %w: %s", pkg, previousRelease, err, out)
				return
			}
		}
	})
	if previous.err != nil {
		t.Fatal(previous.err)
	}
	return previous.daemon, previous.plugin
}

// startDaemon runs bin as the node daemon of n with exactly args, and
// waits for it to be ready.
func startDaemon(t *testing.T, n *node, bin string, args ...string) *daemon {
	t.Helper()
	d := n.spawn(t, bin, args...)
	n.ready(t, d)
	return d
}

// stop ends d as the kubelet does, and wants a clean exit.
func (d *daemon) stop(t *testing.T) {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the daemon did not stop on SIGTERM:\n%s", d.log)
	}
	if d.err != nil {
		t.Fatalf("the daemon stopped with %v:\n%s", d.err, d.log)
	}
}

// The frames the upgrade test judges on every tap, as its VM would send
// them, and whether the datapath must let each through. The tagged and
// extension-header ones are those the previous release's program passed.
type verdictFrame struct {
	name  string
	frame func(att uint16) []byte
	pass  bool
	want  datapath.Decision
}

var verdictFrames = []verdictFrame{
	{"udp4 far", func(a uint16) []byte { return udp4Frame(a, nil, "10.9.0.1", 9999) }, true, datapath.DecisionAllow},
	{"udp4 to a listed gateway port", func(a uint16) []byte { return udp4Frame(a, nil, "10.10.0.254", 53) }, true, datapath.DecisionHostOnly},
	{"udp4 to an unlisted gateway port", func(a uint16) []byte { return udp4Frame(a, nil, "10.10.0.254", 9999) }, false, datapath.DecisionDeny},
	{"QinQ udp4 to an unlisted gateway port", func(a uint16) []byte { return udp4Frame(a, []uint16{0x88a8, 0x8100}, "10.10.0.254", 9999) }, false, datapath.DecisionDeny},
	{"destination options, udp6 to an unlisted gateway port", func(a uint16) []byte { return udp6DestOptsFrame(a, "fd00:a::fe", 9999) }, false, datapath.DecisionDeny},
}

// udp4Frame is a UDP datagram from attachment a's address to dst:port,
// behind the 802.1ad/802.1Q tags of tpids (VLAN 5, 7, ...).
func udp4Frame(a uint16, tpids []uint16, dst string, port uint16) []byte {
	src := netip.AddrFrom4([4]byte{10, 10, byte(a >> 8), byte(a)}).As4()
	d := netip.MustParseAddr(dst).As4()
	ip := make([]byte, 20+8+4)
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	be.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	copy(ip[12:], src[:])
	copy(ip[16:], d[:])
	be.BigEndian.PutUint16(ip[10:], ^onesSum(ip[:20]))
	be.BigEndian.PutUint16(ip[20:], 40000)
	be.BigEndian.PutUint16(ip[22:], port)
	be.BigEndian.PutUint16(ip[24:], 12)
	return ethFrame(tpids, 0x0800, ip)
}

// udp6DestOptsFrame is a UDP datagram from attachment a's IPv6 address to
// dst:port behind an empty destination options header.
func udp6DestOptsFrame(a uint16, dst string, port uint16) []byte {
	src := netip.MustParseAddr(fmt.Sprintf("fd00:a::%x", a)).As16()
	d := netip.MustParseAddr(dst).As16()
	p := make([]byte, 40+8+8+4)
	p[0], p[6], p[7] = 0x60, 60, 64
	be.BigEndian.PutUint16(p[4:], uint16(len(p)-40))
	copy(p[8:], src[:])
	copy(p[24:], d[:])
	p[40] = 17 // the options' next header; length 0: 8 bytes of PadN
	p[42], p[43] = 1, 4
	be.BigEndian.PutUint16(p[48:], 40000)
	be.BigEndian.PutUint16(p[50:], port)
	be.BigEndian.PutUint16(p[52:], 12)
	return ethFrame(nil, 0x86dd, p)
}

func ethFrame(tpids []uint16, ethertype uint16, payload []byte) []byte {
	f := []byte{0x02, 0, 0, 0, 0, 0xfe, 0x02, 0, 0, 0, 0, 0x01}
	for i, tpid := range tpids {
		f = be.BigEndian.AppendUint16(f, tpid)
		f = be.BigEndian.AppendUint16(f, uint16(5+2*i))
	}
	f = be.BigEndian.AppendUint16(f, ethertype)
	f = append(f, payload...)
	for len(f) < 60 {
		f = append(f, 0)
	}
	return f
}

func onesSum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(be.BigEndian.Uint16(b[i:]))
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// openQueue attaches a queue to the tap called name, in whichever queue
// mode its plugin made it (the previous release's are multiqueue).
func openQueue(t *testing.T, h *cniHost, name string) *os.File {
	t.Helper()
	f, err := tun.Open(h.host.File, name, tun.Mode{})
	if err != nil {
		f, err = tun.Open(h.host.File, name, tun.Mode{SingleQueue: true})
	}
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// judge writes each verdict frame into the tap through q, as its VM would,
// and checks the decision the datapath counted against the tap's identity,
// read from the pinned decisions map itself: the other pins may be of
// another build's layout.
func judge(t *testing.T, bpffs string, att string, q *os.File) {
	t.Helper()
	decisions, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, datapath.PinSubdir, "decisions"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer decisions.Close()
	id, _ := identity.ParseBase62("a", att)
	count := func(d datapath.Decision) uint64 {
		key := make([]byte, 16) // struct decision_key: vpc, attachment, decision, padding
		be.NativeEndian.PutUint64(key, uint64(id.VPC))
		be.NativeEndian.PutUint16(key[8:], uint16(id.Attachment))
		key[10] = byte(d)
		var n uint64
		if err := decisions.Lookup(key, &n); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Fatal(err)
		}
		return n
	}
	for _, f := range verdictFrames {
		before := count(f.want)
		if _, err := q.Write(f.frame(uint16(id.Attachment))); err != nil {
			t.Fatalf("tap %s: write %s: %v", tapName(att), f.name, err)
		}
		eventually(t, fmt.Sprintf("tap %s judges %s %s", tapName(att), f.name, f.want), func() (bool, string) {
			n := count(f.want)
			return n == before+1, fmt.Sprintf("%s counted %d, was %d", f.want, n, before)
		})
	}
}

// TestUpgradeFromThePreviousReleaseAndBack runs previousRelease's daemon and
// plugin on a node (a held live tap, an unheld live one, a pending stale
// one, orphan rows, taps with no record and with a record of the first
// format), then this build's over the same bpffs, locks, records and
// inventory, then the previous release's again.
func TestUpgradeFromThePreviousReleaseAndBack(t *testing.T) {
	oldDaemon, oldPlugin := previousBuild(t)
	nettest.RequireTCX(t)
	h := &cniHost{t: t, host: nettest.NewNS(t), ctr: nettest.NewNS(t), bpffs: nettest.BPFFS(t), dataDir: filepath.Join(t.TempDir(), "cni-state"), plugin: oldPlugin}
	n := newNodeOn(t, h.host, h.bpffs)
	h.locks = filepath.Join(n.dir, "locks")
	live := func(atts ...string) string {
		var docs []string
		for _, a := range atts {
			docs = append(docs, fmt.Sprintf("apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: att-%s, namespace: t}\nstatus: {vpc: a, vpcAttachment: %q}\n", a, a))
		}
		return n.writeInventory(docs...)
	}
	inventory := live("1", "2")
	common := []string{"--node-name", "node-a", "--interval", "0", "--bpffs", h.bpffs, "--vrf-lock-dir", h.locks, "--inventory-file", inventory,
		"--admin-socket", n.socket, "--admin-token-file", n.tokens, "--metrics-listen", "", "--log-format", "text"}
	ctr := func(att string) string { return strings.Repeat(att, 64) }
	// Somewhere far to send to, on a node that forwards: judged by the
	// route lookup whether or not a daemon publishes the host view (the
	// previous release does not).
	nettest.Run(t, "ip", "netns", "exec", h.host.Name, "sysctl", "-qw", "net.ipv4.conf.all.forwarding=1", "net.ipv6.conf.all.forwarding=1")
	h.host.IP(t, "link", "add", "far0", "type", "veth", "peer", "name", "far1")
	h.host.IP(t, "link", "set", "far1", "up")
	h.host.IP(t, "link", "set", "far0", "up")
	h.host.IP(t, "route", "add", "10.9.0.0/16", "dev", "far0")
	h.host.IP(t, "route", "add", "10.9.0.0/16", "dev", "far0", "table", "1010")
	conf := func(att string) []byte {
		return h.conf(att, map[string]any{"gateway": map[string]string{"ipv4": "10.10.0.254", "ipv6": "fd00:a::fe"}})
	}

	// The previous release: its daemon pins the maps, its plugin adds.
	d := startDaemon(t, n, oldDaemon, common...)
	for _, att := range []string{"1", "2", "3", "4"} {
		h.mustCNI("ADD", ctr(att), conf(att))
	}
	held := openQueue(t, h, tapName("1")) // the live VM
	defer held.Close()
	// An orphan: the device deleted behind the node's back, its rows and
	// link pin left.
	orphan, _ := h.link(tapName("4"))
	h.host.IP(t, "link", "del", tapName("4"))
	// A record of the first format (no netns) for tap 2, as a release
	// between the two would have written it.
	first, _ := json.Marshal(map[string]string{"tap": tapName("2"), "containerID": ctr("2"), "ifName": "eth0"})
	if err := os.MkdirAll(filepath.Join(h.dataDir, "galactic"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.dataDir, "galactic", tapName("2")), first, 0o600); err != nil {
		t.Fatal(err)
	}
	if code, body := n.call(http.MethodPost, "/v1/passes", adminToken); code != http.StatusOK {
		t.Fatalf("a pass of the previous release: %d %s", code, body)
	}
	taps := map[string]link.Link{}
	for _, att := range []string{"1", "2", "3"} {
		l, ok := h.link(tapName(att))
		if !ok {
			t.Fatalf("the previous release lost tap %s", tapName(att))
		}
		taps[att] = l
	}
	d.stop(t)

	// The upgrade: this build's daemon and plugin over the same node.
	h.plugin = tapPlugin
	d = startDaemon(t, n, binary, append(slices.Clone(common), "--cni-data-dir", h.dataDir, "--min-candidate-age", "0",
		"--layout-record", filepath.Join(n.dir, "datapath-layout"))...)
	for att, l := range taps {
		now, ok := h.link(tapName(att))
		if !ok || now.Index != l.Index {
			t.Fatalf("the upgrade lost tap %s", tapName(att))
		}
		rows := h.rows(l.Index)
		for _, m := range []string{"tap_rules", "ifindex_vrf", "traffic_policy", "tenant_gateway", "host_only_port"} {
			if rows[m] == 0 {
				t.Errorf("tap %s has no %s row after the upgrade: %v", tapName(att), m, rows)
			}
		}
	}
	var st struct {
		Programs struct {
			Current struct{ ID uint32 } `json:"current"`
			Links   int                 `json:"links"`
			OnOther int                 `json:"onOther"`
		} `json:"programs"`
	}
	code, body := n.call(http.MethodGet, "/v1/status", readToken)
	if err := json.Unmarshal(body, &st); code != http.StatusOK || err != nil || st.Programs.Links != 3 || st.Programs.OnOther != 0 {
		t.Fatalf("after the upgrade: status %d %s, want 3 taps, all on the daemon's program", code, body)
	}
	for att, l := range taps {
		if got := linkProgramID(t, h.bpffs, l.Index); uint32(got) != st.Programs.Current.ID {
			t.Errorf("tap %s runs program %d, the daemon's is %d", tapName(att), got, st.Programs.Current.ID)
		}
	}
	judge(t, h.bpffs, "1", held)
	for _, att := range []string{"2", "3"} {
		q := openQueue(t, h, tapName(att))
		judge(t, h.bpffs, att, q)
		q.Close()
	}
	// The pending candidate starts over; the orphan's rows and pin go.
	if code, body := n.call(http.MethodPost, "/v1/passes", adminToken); code != http.StatusOK {
		t.Fatalf("a pass after the upgrade: %d %s", code, body)
	}
	var pending struct {
		Items []struct {
			Tap struct {
				Name string `json:"name"`
			} `json:"tap"`
			Passes int `json:"passes"`
		} `json:"items"`
	}
	code, body = n.call(http.MethodGet, "/v1/taps/pending", readToken)
	if err := json.Unmarshal(body, &pending); code != http.StatusOK || err != nil || len(pending.Items) != 1 || pending.Items[0].Tap.Name != tapName("3") || pending.Items[0].Passes != 1 {
		t.Errorf("pending after the upgrade's first pass: %d %s, want %s seen once", code, body, tapName("3"))
	}
	if _, ok := h.link(tapName("3")); !ok {
		t.Fatal("the first pass after the upgrade removed the stale tap: candidates must start over")
	}
	// The second removes the stale tap and the orphan's rows, and nothing
	// else.
	if code, body := n.call(http.MethodPost, "/v1/passes", adminToken); code != http.StatusOK {
		t.Fatalf("a second pass after the upgrade: %d %s", code, body)
	}
	if _, ok := h.link(tapName("3")); ok {
		t.Error("the second pass after the upgrade kept the stale tap")
	}
	if rows := h.rows(orphan.Index); len(rows) != 0 {
		t.Errorf("the orphan's rows survived two passes after the upgrade: %v", rows)
	}
	// This build's plugin on the previous release's taps: CHECK names what
	// the older registration lacks, GC keeps the listed ones, DEL removes.
	if _, err := h.cni("CHECK", ctr("2"), conf("2")); err == nil || !strings.Contains(err.Error(), "tap_rules") {
		t.Errorf("CHECK of a tap the previous release added: %v, want the tap_rules difference named", err)
	}
	h.mustCNI("DEL", ctr("2"), conf("2"))
	if _, ok := h.link(tapName("2")); ok {
		t.Fatal("DEL of this build left the previous release's tap")
	}
	if _, err := os.Stat(filepath.Join(h.dataDir, "galactic", tapName("2"))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("DEL left the first-format record: %v", err)
	}
	h.mustCNI("ADD", ctr("2"), conf("2"))
	d.stop(t)

	// The downgrade: the previous release over what this build left.
	h.plugin = oldPlugin
	d = startDaemon(t, n, oldDaemon, common...)
	if code, body := n.call(http.MethodPost, "/v1/passes", adminToken); code != http.StatusOK {
		t.Fatalf("a pass after the downgrade: %d %s", code, body)
	}
	for _, att := range []string{"1", "2"} {
		if _, ok := h.link(tapName(att)); !ok {
			t.Fatalf("the downgrade lost live tap %s", tapName(att))
		}
	}
	judge(t, h.bpffs, "1", held)
	h.mustCNI("DEL", ctr("2"), conf("2"))
	if _, ok := h.link(tapName("2")); ok {
		t.Fatal("the previous release's DEL left a tap this build added")
	}
	h.mustCNI("ADD", ctr("5"), conf("5"))
	if _, ok := h.link(tapName("5")); !ok {
		t.Fatal("the previous release's ADD made no tap after the downgrade")
	}
	d.stop(t)
}

// shrinkPins makes each named pinned map again at capacity 16 with its rows
// (as a build with smaller maps would have them), loads the committed
// program over those maps and the other pins, and points ifindex's link at
// it: the node as that build left it.
func shrinkPins(t *testing.T, bpffs string, ifindex uint32, names ...string) {
	t.Helper()
	spec, err := ebpf.LoadCollectionSpec("../ebpf/datapath/datapath_bpfel.o")
	if err != nil {
		t.Fatal(err)
	}
	pinDir := filepath.Join(bpffs, datapath.PinSubdir)
	small := map[string]*ebpf.Map{}
	for _, name := range names {
		ms := spec.Maps[name].Copy()
		ms.MaxEntries, ms.Pinning = 16, ebpf.PinNone
		m, err := ebpf.NewMap(ms)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		cur, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		key := make([]byte, cur.KeySize())
		var val []byte
		for it := cur.Iterate(); it.Next(&key, &val); {
			if name == "tap_fragments" {
				inner, err := ebpf.NewMapFromID(ebpf.MapID(be.NativeEndian.Uint32(val)))
				if err != nil {
					t.Fatal(err)
				}
				err = m.Put(key, inner)
				_ = inner.Close()
				if err != nil {
					t.Fatal(err)
				}
				continue
			}
			v := make([]byte, cur.ValueSize())
			flags := ebpf.MapLookupFlags(0)
			if name == "tap_rules" {
				flags = ebpf.LookupLock
			}
			if err := cur.LookupWithFlags(key, &v, flags); err != nil {
				t.Fatal(err)
			}
			if err := m.Put(key, v); err != nil {
				t.Fatal(err)
			}
		}
		_ = cur.Close()
		small[name] = m
		spec.Maps[name].MaxEntries = 16 // the older build's
	}
	var objs struct {
		Program *ebpf.Program `ebpf:"tap_ingress"`
	}
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		if _, ok := small[name]; ok {
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		small[name] = m
	}
	if err := spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: small}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = objs.Program.Close() })
	if err := objs.Program.Pin(filepath.Join(pinDir, datapath.ProgramsSubdir, "tap_ingress_00000000000000ee")); err != nil {
		t.Fatal(err)
	}
	runOn(t, bpffs, ifindex, objs.Program)
	for _, name := range names {
		pin := filepath.Join(pinDir, name)
		if err := os.Remove(pin); err != nil {
			t.Fatal(err)
		}
		if err := small[name].Pin(pin); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTheDaemonMigratesPinsOfAnotherCapacityUnderALiveTap: a build whose
// row maps were smaller left a held tap judged by its program over those
// maps. This build's daemon gives them its capacities with every row and
// moves the tap to its program: the tap is judged by its rows before and
// after, and this build's plugin reads the migrated pins.
func TestTheDaemonMigratesPinsOfAnotherCapacityUnderALiveTap(t *testing.T) {
	h := newCNIHost(t)
	nettest.Run(t, "ip", "netns", "exec", h.host.Name, "sysctl", "-qw", "net.ipv4.conf.all.forwarding=1", "net.ipv6.conf.all.forwarding=1")
	h.host.IP(t, "link", "add", "far0", "type", "veth", "peer", "name", "far1")
	h.host.IP(t, "link", "set", "far1", "up")
	h.host.IP(t, "link", "set", "far0", "up")
	h.host.IP(t, "route", "add", "10.9.0.0/16", "dev", "far0")
	conf := h.conf("1", map[string]any{"gateway": map[string]string{"ipv4": "10.10.0.254", "ipv6": "fd00:a::fe"}})
	h.mustCNI("ADD", ctrA, conf)
	l, _ := h.link(tapName("1"))
	vm := openQueue(t, h, tapName("1")) // the live VM
	defer vm.Close()
	shrinkPins(t, h.bpffs, l.Index, "ifindex_vrf", "tap_rules", "tap_fragments")
	judge(t, h.bpffs, "1", vm)

	n := newNodeOn(t, h.host, h.bpffs)
	d := n.run(t, "--inventory-file", n.writeInventory(liveAttachment), "--layout-record", filepath.Join(n.dir, "datapath-layout"))
	n.ready(t, d)
	if !strings.Contains(d.log.String(), "pinned maps of another capacity migrated") {
		t.Errorf("the daemon did not say it migrated the pins:\n%s", d.log)
	}
	for _, name := range []string{"ifindex_vrf", "tap_rules", "tap_fragments"} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(h.bpffs, datapath.PinSubdir, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		if m.MaxEntries() == 16 {
			t.Errorf("%s still has the older capacity", name)
		}
		_ = m.Close()
	}
	var st struct {
		Programs struct {
			Links   int `json:"links"`
			OnOther int `json:"onOther"`
		} `json:"programs"`
	}
	code, body := n.call(http.MethodGet, "/v1/status", readToken)
	if err := json.Unmarshal(body, &st); code != http.StatusOK || err != nil || st.Programs.Links != 1 || st.Programs.OnOther != 0 {
		t.Fatalf("status after the migration: %d %s, want the tap on the daemon's program", code, body)
	}
	judge(t, h.bpffs, "1", vm)
	// This build's plugin reads the migrated pins.
	h.mustCNI("CHECK", ctrA, conf)
	h.mustCNI("DEL", ctrA, conf)
	if _, ok := h.link(tapName("1")); ok {
		t.Fatal("DEL over the migrated pins left the tap")
	}
}
