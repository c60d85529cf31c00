package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

var binary, tapPlugin string

// binDir holds what TestMain builds, and the stock plugins stockPlugins
// builds, and goes when the test binary ends.
var binDir string

// hookedBinary is the daemon built with the galactic_testhooks tag, for the
// tests that need its seams; product builds carry none.
var hookedBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "galactic-node-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	binary = filepath.Join(dir, "galactic-node")
	tapPlugin = filepath.Join(dir, "galactic-tap")
	for _, b := range []struct {
		out, pkg string
		flags    []string
	}{
		{binary, "../cmd/galactic-node", nil},
		// The plugin stripped, as the image ships it (the Makefile's
		// TAP_LDFLAGS): the runtime execs it for every verb, and the
		// benchmarks time those execs against the stock plugins, built
		// static and stripped too (stockPlugins).
		{tapPlugin, "../cmd/galactic-tap", []string{"-ldflags=-s -w"}},
	} {
		if out, err := goBuild(append(b.flags, "-o", b.out, b.pkg)...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.pkg, err, out)
			os.Exit(1)
		}
	}
	hookedBinary = filepath.Join(dir, "galactic-node-testhooks")
	if out, err := goBuild("-tags", "galactic_testhooks", "-o", hookedBinary, "../cmd/galactic-node").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the daemon with test hooks: %v\n%s", err, out)
		os.Exit(1)
	}
	code := clustertest.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// goBuild is `go build` with the flags `make images` builds the product
// with (static, no build paths), which `make test` runs first: the packages
// come out of the build cache it filled, where a cgo build would compile
// the client-go tree once more, minutes of a cold run on two cores. It also
// makes the binaries under test the ones the images ship.
func goBuild(args ...string) *exec.Cmd {
	cmd := exec.Command("go", append([]string{"build", "-trimpath"}, args...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	return cmd
}

const (
	adminToken = "admin-e2e-0123456789abcdef"
	readToken  = "read-e2e-0123456789abcdef"
)

// node is a scene: a netns with a private bpffs, lock folder and socket,
// where taps are made with the binary and the daemon runs.
type node struct {
	t       *testing.T
	ns      *nettest.NS
	dir     string
	bpffs   string
	socket  string
	tokens  string
	daemons []*exec.Cmd
	bin     string // the daemon start runs; empty: binary
	// wrap runs before the daemon inside the namespace (setpriv, say):
	// how the daemon's capabilities or mounts differ from the test's.
	wrap []string
}

func newNode(t *testing.T) *node {
	return newNodeOn(t, nettest.NewNS(t), nettest.BPFFS(t))
}

// newNodeOn is a node whose daemon runs in ns over the bpffs at bpffs.
func newNodeOn(t *testing.T, ns *nettest.NS, bpffs string) *node {
	n := &node{t: t, ns: ns, dir: t.TempDir(), bpffs: bpffs}
	n.socket = filepath.Join(n.dir, "admin.sock")
	n.tokens = filepath.Join(n.dir, "tokens")
	if err := os.WriteFile(n.tokens, []byte("admin "+adminToken+"\nread "+readToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return n
}

func (n *node) common() []string {
	return []string{"--bpffs", n.bpffs, "--vrf-lock-dir", filepath.Join(n.dir, "locks")}
}

// tapAdd makes a tap as CNI ADD would, through the binary.
func (n *node) tapAdd(att, owner string) {
	n.t.Helper()
	nettest.RequireTCX(n.t) // tap add attaches the datapath program
	args := append([]string{"netns", "exec", n.ns.Name, binary, "tap", "add", "--vpc", "a", "--attachment", att, "--owner", owner,
		"--master", "bridge", "--table", "1010", "--route", "10.10.0." + att + "/32", "--gateway4", "10.10.0.254", "--host-port", "udp/53"}, n.common()...)
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("tap add %s: %v: %s", att, err, out)
	}
}

// start runs the daemon in the namespace and returns it with its log.
func (n *node) start(extra ...string) (*exec.Cmd, *bytes.Buffer) {
	n.t.Helper()
	return n.startFor(n.t, extra...)
}

func (n *node) startFor(tb testing.TB, extra ...string) (*exec.Cmd, *bytes.Buffer) {
	bin := binary
	if n.bin != "" {
		bin = n.bin
	}
	args := append([]string{"netns", "exec", n.ns.Name}, n.wrap...)
	args = append(append(args, bin, "run", "--node-name", "node-a", "--interval", "0",
		"--admin-socket", n.socket, "--admin-token-file", n.tokens, "--metrics-listen", "127.0.0.1:9180", "--log-format", "text",
		"--min-candidate-age", "0"), n.common()...) // a test passes its own age after this to override it
	cmd := exec.Command("ip", append(args, withOwnBrakeMemory(n, extra)...)...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	n.daemons = append(n.daemons, cmd)
	tb.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return cmd, &log
}

// withOwnBrakeMemory gives a daemon of this build the node's own brake
// memory file, layout record and CNI records folder unless args name them:
// at the defaults, every test's daemon would share the host's, one test's
// brake would hold in the next, and the daemon refuses them outside the
// host's network namespace.
func withOwnBrakeMemory(n *node, args []string) []string {
	args = slices.Clone(args)
	for _, p := range []struct{ flag, path string }{
		{"--brake-memory", filepath.Join(n.dir, "brake.json")},
		{"--layout-record", filepath.Join(n.dir, "datapath-layout")},
		{"--cni-data-dir", filepath.Join(n.dir, "cni-data")},
	} {
		if !slices.Contains(args, p.flag) && !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, p.flag+"=") }) {
			args = append(args, p.flag, p.path)
		}
	}
	return args
}

func (n *node) client() *http.Client {
	// A connection per request: a new Transport's kept-alive connection
	// would stay open against the daemon's connection cap.
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", n.socket)
	}}}
}

func (n *node) call(method, path, token string) (int, []byte) {
	n.t.Helper()
	req, _ := http.NewRequest(method, "http://node"+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := n.client().Do(req)
	if err != nil {
		n.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// callFresh is call without failing the test when nothing answers: code 0.
func (n *node) callFresh(method, path, token string) (int, []byte) {
	req, _ := http.NewRequest(method, "http://node"+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	c := n.client()
	c.Timeout = time.Minute
	resp, err := c.Do(req)
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// linkGone reports whether no link of that name exists in the namespace.
func (n *node) linkGone(name string) (string, bool) {
	out, err := exec.Command("ip", "-n", n.ns.Name, "link", "show", name).CombinedOutput()
	return string(out), err != nil
}

func (n *node) waitReady(log *bytes.Buffer) {
	n.t.Helper()
	n.waitReadyFor(n.t, log)
}

func (n *node) waitReadyFor(tb testing.TB, log *bytes.Buffer) {
	deadline := time.Now().Add(30 * time.Second)
	last := ""
	for time.Now().Before(deadline) {
		resp, err := n.client().Get("http://node/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = string(b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, d := range n.daemons {
		_ = d.Process.Kill()
		_ = d.Wait()
	}
	tb.Fatalf("the daemon never became ready (last answer %q):\n%s", last, log)
}

// metrics scrapes the daemon's metrics listener in the namespace.
func (n *node) metrics() string {
	n.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", n.ns.Name, "curl", "-sS", "127.0.0.1:9180/metrics").Output()
	if err != nil {
		n.t.Fatalf("scrape metrics: %v", err)
	}
	return string(out)
}

func (n *node) ifindex(name string) string {
	n.t.Helper()
	return strings.TrimSpace(nettest.Run(n.t, "ip", "netns", "exec", n.ns.Name, "cat", "/sys/class/net/"+name+"/ifindex"))
}

func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	kc.CurrentContext = "e2e"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestTheDaemonReclaimsAStaleTapOverHTTP runs the built binary in a netns
// against a real API server and drives it as an operator: the stale tap is
// pending after the first forced pass, reclaimed by the second, and its eBPF
// rows are listed before and gone after; the held and live taps stay.
func TestTheDaemonReclaimsAStaleTapOverHTTP(t *testing.T) {
	cluster := clustertest.Shared(t)
	cluster.DeleteAll(t, kubeinventory.AttachmentResource)
	t.Cleanup(func() { cluster.DeleteAll(t, kubeinventory.AttachmentResource) })
	cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-2", "a", "2"))

	n := newNode(t)
	for _, att := range []string{"1", "2", "3"} {
		n.tapAdd(att, "sandbox-"+att)
	}
	nettest.Hold(t, n.ns, "G00000000a001H", nettest.HoldOptions{})
	stale := n.ifindex("G00000000a003H")

	// The daemon runs inside the namespace; the API server listens on the
	// host's loopback, relayed to the namespace's.
	nettest.ForwardLoopback(t, n.ns, strings.TrimSuffix(strings.TrimPrefix(cluster.Config.Host, "https://"), "/"))
	daemon, log := n.start("--kubeconfig", writeKubeconfig(t, cluster.Config))
	n.waitReady(log)

	code, body := n.call("GET", "/v1/ebpf/interfaces/"+stale, readToken)
	if code != http.StatusOK || !strings.Contains(string(body), `"traffic_policy"`) || !strings.Contains(string(body), `"attached": true`) {
		t.Fatalf("rows before: %d %s", code, body)
	}
	code, body = n.call("GET", "/v1/ebpf/maps/ifindex_vrf?ifindex="+stale, readToken)
	if code != http.StatusOK || !strings.Contains(string(body), `"attachment": "3"`) {
		t.Fatalf("ifindex_vrf rows before: %d %s", code, body)
	}

	if code, body := n.call("POST", "/v1/passes", adminToken); code != http.StatusOK {
		t.Fatalf("pass 1: %d %s", code, body)
	}
	code, body = n.call("GET", "/v1/taps/pending", readToken)
	var pending struct {
		Items []struct {
			Tap struct{ Name string } `json:"tap"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &pending); err != nil || code != http.StatusOK || len(pending.Items) != 1 || pending.Items[0].Tap.Name != "G00000000a003H" {
		t.Fatalf("pending after pass 1: %d %s", code, body)
	}

	code, body = n.call("POST", "/v1/passes", adminToken)
	var report struct {
		Reclaimed []struct{ Name string } `json:"reclaimed"`
	}
	if err := json.Unmarshal(body, &report); err != nil || code != http.StatusOK || len(report.Reclaimed) != 1 {
		t.Fatalf("pass 2: %d %s", code, body)
	}
	// Nothing of it is left: no program, no row, so NotFound.
	code, body = n.call("GET", "/v1/ebpf/interfaces/"+stale, readToken)
	if code != http.StatusNotFound || !strings.Contains(string(body), "interface "+stale+" not found") {
		t.Fatalf("rows after: %d %s", code, body)
	}
	code, body = n.call("GET", "/v1/taps", readToken)
	for _, want := range []string{`"G00000000a001H"`, `"G00000000a002H"`, `"state": "held"`, `"state": "live"`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("taps after: want %s in %d %s", want, code, body)
		}
	}
	if strings.Contains(string(body), "G00000000a003H") {
		t.Errorf("the reclaimed tap is still listed: %s", body)
	}

	if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := daemon.Wait(); err != nil {
		t.Fatalf("exit after SIGTERM: %v\n%s", err, log)
	}
	if strings.Contains(log.String(), adminToken) || strings.Contains(log.String(), readToken) {
		t.Fatal("the daemon's log contains a token")
	}
}

func TestTheAdminSocketIsPrivateAndOwnedByOneDaemon(t *testing.T) {
	n := newNode(t)
	inv := filepath.Join(n.dir, "inventory.yaml")
	if err := os.WriteFile(inv, []byte("apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: a, namespace: b}\nstatus: {vpc: a, vpcAttachment: \"1\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	first, log := n.start("--inventory-file", inv)
	n.waitReady(log)
	fi, err := os.Stat(n.socket)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket %v mode %v, want a 0600 socket", err, fi.Mode())
	}

	second, log2 := n.start("--inventory-file", inv, "--metrics-listen", "")
	err = second.Wait()
	if err == nil || !strings.Contains(log2.String(), "in use by a running daemon") {
		t.Fatalf("a second daemon on a live socket: %v\n%s", err, log2)
	}
	if code, _ := n.call("GET", "/v1/taps", readToken); code != http.StatusOK {
		t.Fatal("the first daemon stopped answering")
	}

	_ = first.Process.Kill() // a crash leaves the socket file behind
	_ = first.Wait()
	if _, err := os.Stat(n.socket); err != nil {
		t.Fatalf("socket after a crash: %v", err)
	}
	_, log3 := n.start("--inventory-file", inv)
	n.waitReady(log3)
	if code, _ := n.call("GET", "/v1/taps", readToken); code != http.StatusOK {
		t.Fatalf("the daemon that replaced a stale socket does not answer:\n%s", log3)
	}
}
