package robustness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/link"
	"github.com/datum-cloud/galactic-node/node/netns"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

var attachmentsGVR = schema.GroupVersionResource{Group: "cloud.datumapis.com", Version: "v1alpha1", Resource: "vpcattachments"}

const (
	adminToken = "admin-robustness-0123456789abcdef"
	apiAddr    = "10.251.0.1" // the API server, as the node's namespace reaches it
	network    = "robust"     // the CNI network's name
)

// scene is one node: a network namespace with its own bpffs, lock folder,
// CNI records and libcni cache, where the daemon under test runs and the
// plugin makes taps; a container namespace for CNI_NETNS; and a relay to
// the API server that a fault can slow, or drop every packet of.
type scene struct {
	t          *testing.T
	dir        string
	host, ctr  *nettest.NS
	bpffs      string
	locks      string
	data       string // the plugin's records
	cache      string // libcni's
	socket     string
	tokens     string
	kubeconfig string
	cluster    *clustertest.Cluster
	namespace  string // of this run's VPCAttachments
	node       string
	vpc        identity.VPC
	daemonBin  string
	env        []string // the daemon's extra environment (a broken rule)
	extra      []string // the daemon's extra flags
	flags      map[string]bool
	cni        *libcni.CNIConfig
	conn       *link.Conn
	delay      atomic.Int64 // the relay's, in ns
	client     *http.Client

	mu     sync.Mutex // guards daemon
	daemon *daemonProc
}

type daemonProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

func newScene(t *testing.T, cluster *clustertest.Cluster, run int, daemonBin string, env []string) *scene {
	t.Helper()
	nettest.RequireTCX(t)
	s := &scene{t: t, dir: t.TempDir(), host: nettest.NewNS(t), ctr: nettest.NewNS(t), bpffs: nettest.BPFFS(t),
		cluster: cluster, namespace: fmt.Sprintf("robust-%d", run), node: fmt.Sprintf("robust-node-%d", run),
		vpc: identity.VPC(1000 + run), daemonBin: daemonBin, env: env}
	s.locks = filepath.Join(s.dir, "locks")
	s.data = filepath.Join(s.dir, "cni-data")
	s.cache = filepath.Join(s.dir, "cni-cache")
	s.socket = filepath.Join(s.dir, "admin.sock")
	s.tokens = filepath.Join(s.dir, "tokens")
	for _, d := range []string{s.locks, s.data, s.cache} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(s.tokens, []byte("admin "+adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.flags = daemonFlags(t, daemonBin)
	s.connectAPI()
	bin := t.TempDir()
	if err := os.Symlink(bins.plugin, filepath.Join(bin, "galactic-tap")); err != nil {
		t.Fatal(err)
	}
	s.cni = libcni.NewCNIConfigWithCacheDir([]string{bin}, s.cache, &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: io.Discard}})
	s.conn = s.host.Dial(t)
	s.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", s.socket)
		}}}
	cluster.Apply(t, schema.GroupVersionResource{Version: "v1", Resource: "namespaces"},
		nsObject(s.namespace))
	// Other tenants' attachments, which stay: a cluster where nothing
	// carries an identity is one the daemon rightly refuses to trust
	// (inventory.Snapshot.Healthy), and would hold every removal.
	for i := 1; i <= 3; i++ {
		other := identity.VPC(5000 + run)
		cluster.Apply(t, attachmentsGVR, clustertest.Attachment(s.namespace, fmt.Sprintf("other-%d", i), other.Base62(), identity.Attachment(i).Base62()))
	}
	return s
}

// daemonFlags lists the flags bin's `run` knows: an older build lacks
// some (--brake-memory, --events, --inventory), and is run without them.
func daemonFlags(t *testing.T, bin string) map[string]bool {
	out, _ := exec.Command(bin, "run", "-h").CombinedOutput()
	flags := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if f, ok := strings.CutPrefix(strings.TrimSpace(line), "-"); ok {
			flags[strings.Fields(f)[0]] = true
		}
	}
	if !flags["interval"] {
		t.Fatalf("%s run -h lists no flags:\n%s", bin, out)
	}
	return flags
}

// connectAPI gives the node's namespace a veth to a namespace of its own
// whose relay forwards to the API server on the host's loopback, holding
// back what the server sends by s.delay, and writes the daemon's
// kubeconfig (cluster-admin: RBAC is integration's subject, not this one).
func (s *scene) connectAPI() {
	t := s.t
	api := nettest.NewNS(t)
	nettest.Veth(t, s.host, api, "10.251.0.2/30", apiAddr+"/30")
	host, err := url.Parse(s.cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	nettest.ForwardDelayed(t, api, net.JoinHostPort(apiAddr, host.Port()), host.Host, func() time.Duration {
		return time.Duration(s.delay.Load())
	})
	cfg := s.cluster.Config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["r"] = &clientcmdapi.Cluster{Server: "https://" + net.JoinHostPort(apiAddr, host.Port()), CertificateAuthorityData: cfg.CAData, TLSServerName: "localhost"}
	kc.AuthInfos["r"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["r"] = &clientcmdapi.Context{Cluster: "r", AuthInfo: "r"}
	kc.CurrentContext = "r"
	s.kubeconfig = filepath.Join(s.dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, s.kubeconfig); err != nil {
		t.Fatal(err)
	}
}

// partition drops every packet between the node and the API server, with
// no reset: requests hang until their own bounds. It returns the heal.
func (s *scene) partition() func() {
	return nettest.Partition(s.t, s.host, apiAddr)
}

// startDaemon runs the daemon under test in the node's namespace, its log
// appended to daemon.log, and waits until it answers its admin socket.
func (s *scene) startDaemon() error {
	args := []string{"netns", "exec", s.host.Name, s.daemonBin, "run", "--node-name", s.node,
		"--kubeconfig", s.kubeconfig, "--interval", "0", "--min-candidate-age", minAge.String(),
		"--admin-socket", s.socket, "--admin-token-file", s.tokens, "--admin-forces-per-minute", "100000",
		"--metrics-listen", "127.0.0.1:9180", "--log-format", "text", "--log-level", "debug",
		"--bpffs", s.bpffs, "--vrf-lock-dir", s.locks, "--cni-data-dir", s.data, "--cni-cache-dirs", s.cache,
		"--layout-record", filepath.Join(s.dir, "layout"), "--inventory-proof-timeout", "2s",
		"--inventory-max-age", "8s", "--mass-removal-release-after", "0"}
	args = append(args, s.extra...)
	if s.flags["brake-memory"] {
		args = append(args, "--brake-memory", filepath.Join(s.dir, "brake.json"))
	}
	log, err := os.OpenFile(filepath.Join(s.dir, "daemon.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start the daemon: %w", err)
	}
	d := &daemonProc{cmd: cmd, done: make(chan struct{}), log: log}
	go func() { _ = cmd.Wait(); log.Close(); close(d.done) }()
	s.mu.Lock()
	s.daemon = d
	s.mu.Unlock()
	s.t.Cleanup(func() { _ = cmd.Process.Kill(); <-d.done })
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		select {
		case <-d.done:
			return fmt.Errorf("the daemon exited at start: %s (its log: %s)", cmd.ProcessState, filepath.Join(s.dir, "daemon.log"))
		default:
		}
		if code, _, err := s.call("GET", "/v1/status"); err == nil && code == http.StatusOK {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("the daemon did not answer its admin socket within a minute")
}

// killDaemon SIGKILLs the daemon and waits until it is gone.
func (s *scene) killDaemon() {
	s.mu.Lock()
	d := s.daemon
	s.daemon = nil
	s.mu.Unlock()
	if d == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.done
}

func (s *scene) up() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.daemon != nil
}

// call makes one admin API request.
func (s *scene) call(method, path string) (int, []byte, error) {
	return s.callCtx(context.Background(), method, path)
}

func (s *scene) callCtx(ctx context.Context, method, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://node"+path, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// brake reads /v1/status's brake.
func (s *scene) brake() (Brake, error) {
	code, body, err := s.call("GET", "/v1/status")
	if err != nil {
		return Brake{}, err
	}
	if code != http.StatusOK {
		return Brake{}, fmt.Errorf("GET /v1/status: %d: %.200s", code, body)
	}
	var st struct{ Brake Brake }
	if err := json.Unmarshal(body, &st); err != nil {
		return Brake{}, fmt.Errorf("GET /v1/status: %w", err)
	}
	return st.Brake, nil
}

// passRef is a removal a pass report lists.
type passRef struct {
	Name    string `json:"name"`
	Ifindex uint32 `json:"ifindex"`
}

type passReport struct {
	Started   string    `json:"started"`
	Result    string    `json:"result"`
	Reclaimed []passRef `json:"reclaimed"`
	Removing  []passRef `json:"removing"` // the pass in flight's deletes under way
}

// passes reads /v1/passes, the pass in flight first.
func (s *scene) passes() ([]passReport, error) {
	code, body, err := s.call("GET", "/v1/passes?limit=32")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/passes: %d: %.200s", code, body)
	}
	var list struct{ Items []passReport } // a list object, as kubectl's
	if err := json.Unmarshal(body, &list); err == nil && list.Items != nil {
		return list.Items, nil
	}
	var reps []passReport // an older build's bare array
	if err := json.Unmarshal(body, &reps); err != nil {
		return nil, fmt.Errorf("GET /v1/passes: %w: %.200s", err, body)
	}
	return reps, nil
}

// tenantTaps lists the node's tenant taps by name.
func (s *scene) tenantTaps() (map[string]uint32, error) {
	links, err := s.conn.Links(context.Background())
	if err != nil {
		return nil, err
	}
	taps := map[string]uint32{}
	for _, l := range links {
		if _, err := identity.ParseTapName(l.Name); err == nil {
			taps[l.Name] = l.Index
		}
	}
	return taps, nil
}

// tapName is the tap of attachment att in the run's VPC.
func (s *scene) tapName(att int) string {
	return identity.Identity{VPC: s.vpc, Attachment: identity.Attachment(att)}.TapName()
}

// conf is the run's network for attachment att, as a runtime reads it.
func (s *scene) conf(att int) *libcni.NetworkConfigList {
	a := identity.Attachment(att)
	b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": network, "plugins": []any{map[string]any{
		"type": "galactic-tap", "vpc": s.vpc.Base62(), "vpcAttachment": a.Base62(), "table": 1010,
		"master": "bridge", // no VRF in this kernel: the bridge stands in
		"routes": []string{fmt.Sprintf("10.20.%d.%d/32", att>>8, att&0xff)}, "gateway": map[string]string{"ipv4": "10.20.255.254"},
		"bpffs": s.bpffs, "vrfLockDir": s.locks, "dataDir": s.data,
	}}})
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		s.t.Fatal(err)
	}
	return l
}

func (s *scene) rt(container string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: container, NetNS: "/run/netns/" + s.ctr.Name, IfName: "eth0"}
}

// inHost runs fn with the thread in the node's namespace: the plugins
// libcni executes inherit it, as a runtime's do.
func (s *scene) inHost(fn func(ctx context.Context) error) error {
	return netns.Do(s.host.File, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return fn(ctx)
	})
}

// killedAdd runs the plugin's ADD as libcni would, and SIGKILLs it after
// delay: a runtime's plugin process killed mid-ADD.
func (s *scene) killedAdd(att int, container string, delay time.Duration) error {
	l := s.conf(att)
	var conf map[string]any
	_ = json.Unmarshal(l.Plugins[0].Bytes, &conf)
	conf["cniVersion"], conf["name"] = "1.1.0", network
	b, _ := json.Marshal(conf)
	cmd := exec.Command("ip", "netns", "exec", s.host.Name, bins.plugin)
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=" + container, "CNI_NETNS=/run/netns/" + s.ctr.Name,
		"CNI_IFNAME=eth0", "CNI_PATH=/opt/cni/bin", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdin = bytes.NewReader(b)
	if delay < 0 {
		return s.killedAtRecord(cmd)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	time.Sleep(delay)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	return cmd.Wait()
}

// afterKilledAdd waits until the tap a killed ADD was making is either
// gone or persistent. The plugin makes a tap with TUNSETIFF and persists it
// after: killed in between, its file closes with the process and the
// kernel destroys the tap, a removal that is neither the daemon's nor a
// DEL's, and that ends a moment after the process (the unregister runs
// after the close).
func (s *scene) afterKilledAdd(tap string) {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		l, err := s.conn.GetByName(context.Background(), tap)
		if errors.Is(err, link.ErrLinkGone) || (err == nil && l.Tun != nil && l.Tun.Persist) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killedAtRecord starts cmd, a plugin's ADD, and SIGKILLs it the moment a
// record's temp file appears in the network's folder (inotify): between
// the temp file and its rename, the window a kill leaves a stray in, a
// failpoint the plugin has no hook for. Most kills land just after the
// rename; some land inside.
func (s *scene) killedAtRecord(cmd *exec.Cmd) error {
	dir := filepath.Join(s.data, network)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inotify: %w", err)
	}
	defer unix.Close(fd)
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE); err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds, 100); n <= 0 {
			continue
		}
		n, _ := unix.Read(fd, buf)
		if n > 0 && bytes.Contains(buf[:n], []byte(".tmp-")) {
			break
		}
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	return cmd.Wait()
}

// cli runs the daemon binary's operator commands in the node's namespace.
func (s *scene) cli(args ...string) ([]byte, error) {
	return exec.Command("ip", append([]string{"netns", "exec", s.host.Name, s.daemonBin}, args...)...).CombinedOutput()
}

func (s *scene) tapArgs(verb string, att int) []string {
	a := identity.Attachment(att)
	return []string{"tap", verb, "--vpc", s.vpc.Base62(), "--attachment", a.Base62(), "--owner", "robust-cli",
		"--master", "bridge", "--table", "1010", "--route", fmt.Sprintf("10.20.%d.%d/32", att>>8, att&0xff),
		"--gateway4", "10.20.255.254", "--bpffs", s.bpffs, "--vrf-lock-dir", s.locks}
}

// hold opens the tap as a VMM does: single-queue, as the plugin makes
// taps, or multiqueue, as `tap add` does, whichever the kernel takes.
func (s *scene) hold(name string) (*nettest.Holder, error) {
	h, err := nettest.TryHold(s.t, s.host, name, nettest.HoldOptions{Mode: tun.Mode{SingleQueue: true}})
	if errors.Is(err, unix.EINVAL) {
		h, err = nettest.TryHold(s.t, s.host, name, nettest.HoldOptions{Mode: tun.Mode{}})
	}
	return h, err
}

func (s *scene) createAttachment(att int) error {
	a := clustertest.Attachment(s.namespace, fmt.Sprintf("att-%d", att), s.vpc.Base62(), identity.Attachment(att).Base62())
	a.Object["status"].(map[string]any)["node"] = s.node
	ri := s.cluster.Client.Resource(attachmentsGVR).Namespace(s.namespace)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	created, err := ri.Create(ctx, a, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create attachment %d: %w", att, err)
	}
	a.SetResourceVersion(created.GetResourceVersion())
	if _, err := ri.UpdateStatus(ctx, a, metav1.UpdateOptions{}); err != nil {
		// Stored without its identity: carried by nothing; delete it so
		// that the model stays true.
		_ = ri.Delete(ctx, a.GetName(), metav1.DeleteOptions{})
		return fmt.Errorf("set attachment %d's status: %w", att, err)
	}
	return nil
}

func (s *scene) deleteAttachment(att int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := s.cluster.Client.Resource(attachmentsGVR).Namespace(s.namespace).Delete(ctx, fmt.Sprintf("att-%d", att), metav1.DeleteOptions{})
	if err != nil {
		return fmt.Errorf("delete attachment %d: %w", att, err)
	}
	return nil
}

// residue lists what the node holds that no live tap explains: eBPF rows
// and pins of interfaces that are gone, CNI records of taps that are gone,
// and temp files a killed writer left.
func (s *scene) residue(taps map[string]uint32) []string {
	var out []string
	live := map[uint32]bool{}
	for _, ifindex := range taps {
		live[ifindex] = true
	}
	dp, err := datapath.OpenPinned(s.bpffs)
	if err != nil {
		return []string{fmt.Sprintf("open the pinned maps: %v", err)}
	}
	defer dp.Close()
	reg := attachreg.New(dp, s.host.File, slog.New(slog.DiscardHandler))
	regs, err := reg.Registered()
	if err != nil {
		return []string{fmt.Sprintf("list the registered interfaces: %v", err)}
	}
	for _, r := range regs {
		if !live[r.Ifindex] {
			out = append(out, fmt.Sprintf("ifindex %d (%s) has rows %v, pinned %v, and no tap", r.Ifindex, r.Identity, r.Rows, r.Pinned))
		}
	}
	err = filepath.WalkDir(s.data, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		name := d.Name()
		switch {
		case strings.HasPrefix(name, ".tmp-"):
			out = append(out, "a killed writer's temp file "+path)
		case strings.HasPrefix(name, "."):
		default:
			if _, ok := taps[name]; !ok {
				out = append(out, "a record of a tap that is gone: "+path)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		out = append(out, fmt.Sprintf("read the CNI records: %v", err))
	}
	slices.Sort(out)
	return out
}

func nsObject(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name}}}
}
