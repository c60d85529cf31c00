package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/datum-cloud/galactic-node/node/netns"
)

// The node's fixed addresses. Everything runs in the node's own network
// namespace, so none of them can clash with the host's.
const (
	nodeName  = "galactic-e2e"
	nodeIP    = "192.168.240.2"
	serviceIP = "10.96.0.1" // the kubernetes Service: no kube-proxy, so it is an address of the node
	podSubnet = "10.244.0.0/24"
	podNet    = "podnet" // the primary network's name, host-local's folder
)

// boundPaths are the host paths the node's processes (and the pods'
// hostPath volumes) see as folders of the test's own: the node writes
// nothing outside them.
var boundPaths = []string{
	"/var/lib/kubelet", "/var/lib/containerd", "/run/containerd", "/opt/containerd",
	"/var/lib/cni", "/opt/cni/bin", "/etc/cni/net.d", "/run/galactic", "/opt/galactic", "/var/lib/galactic",
	"/var/log/pods", "/var/log/containers", "/run/netns",
}

// kernelDefaults are the values kubelet's protectKernelDefaults wants. In
// the node's mount namespace files holding them are bound over /proc/sys,
// so the kubelet starts without writing the host's settings.
var kernelDefaults = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// node is a one-node Kubernetes cluster in namespaces of its own: a network
// namespace holding every address, a mount namespace in which the paths
// above are the test's folders and /sys/fs/bpf a bpffs of its own, and a
// cgroup subtree under every hierarchy that holds every process it starts.
type node struct {
	dir     string // everything the node writes
	bins    string // hack/e2ebin.sh's folder
	runtime runtimeKind
	testbin string // hack/testbin.sh's folder
	netns   string
	nsFile  *os.File
	cgroup  string   // the subtree's name under each hierarchy's root
	cgroups []string // the subtree in each hierarchy
	holder  *exec.Cmd
	created []string // mount points made on the host, removed at the end
	daemons map[string]*daemon
	pki     *pki
	admin   string // cluster-admin kubeconfig
	config  *rest.Config
	client  kubernetes.Interface
	release string // the release folder galactic was installed from; empty: deploy/
}

func (n *node) root(p string) string { return filepath.Join(n.dir, "root", p) }

// startNode starts a node on rt. On an error it returns the node too, so
// that its logs can be read, and stops it when the caller does.
func startNode(ctx context.Context, logf func(string, ...any), bins, testbin string, rt runtimeKind) (n *node, err error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	dir, err := os.MkdirTemp("/var/tmp", "galactic-e2e-")
	if err != nil {
		return nil, err
	}
	n = &node{dir: dir, bins: bins, testbin: testbin, runtime: rt, netns: "galactic-e2e-" + id, cgroup: "galactic-e2e-" + id, daemons: map[string]*daemon{}}
	steps := []struct {
		what string
		do   func() error
	}{
		{"network namespace", n.makeNetns},
		{"cgroups", n.makeCgroups},
		{"folders", n.makeFolders},
		{"mount namespace", n.startHolder},
		{"certificates", n.makePKI},
		{"etcd", n.startEtcd},
		{"kube-apiserver", func() error { return n.startAPIServer(ctx) }},
		{"kube-controller-manager and kube-scheduler", n.startControllers},
		{"containerd", func() error { return n.startContainerd(ctx) }},
		{"kubelet", func() error { return n.startKubelet(ctx) }},
		// A pod in a namespace before its ServiceAccount is refused.
		{"the default ServiceAccount", func() error {
			return n.waitFor(ctx, "the default ServiceAccount", 2*time.Minute, func() (bool, error) {
				_, err := n.client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
				return err == nil, nil
			})
		}},
	}
	for _, s := range steps {
		start := time.Now()
		if err := s.do(); err != nil {
			return n, fmt.Errorf("start the node: %s: %w", s.what, err)
		}
		logf("node: %s up in %s", s.what, time.Since(start).Round(time.Millisecond))
	}
	return n, nil
}

func run(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

func (n *node) makeNetns() error {
	if _, err := run("ip", "netns", "add", n.netns); err != nil {
		return err
	}
	f, err := os.Open("/run/netns/" + n.netns)
	if err != nil {
		return err
	}
	n.nsFile = f
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"addr", "add", serviceIP + "/32", "dev", "lo"},
		// No dummy module on these kernels: a veth pair, both ends here.
		{"link", "add", "node0", "type", "veth", "peer", "name", "node0-peer"},
		{"link", "set", "node0-peer", "up"},
		{"addr", "add", nodeIP + "/24", "dev", "node0"},
		{"link", "set", "node0", "up"},
		{"route", "add", "default", "via", "192.168.240.1", "dev", "node0", "onlink"},
	} {
		if _, err := run("ip", append([]string{"-n", n.netns}, args...)...); err != nil {
			return err
		}
	}
	return nil
}

// makeCgroups makes the subtree, and its system child for the node's own
// daemons, in every cgroup hierarchy mounted (cgroup v1 and the unified
// one): kubelet's cgroupRoot must exist in each.
func (n *node) makeCgroups() error {
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return err
	}
	for line := range strings.SplitSeq(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || (f[2] != "cgroup" && f[2] != "cgroup2") {
			continue
		}
		base := filepath.Join(f[1], n.cgroup)
		for _, d := range []string{base, filepath.Join(base, "system")} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return fmt.Errorf("make cgroup %s: %w", d, err)
			}
			if d == base {
				n.cgroups = append(n.cgroups, base) // removed by stop from here on
			}
			// A v1 cpuset takes no process until it has CPUs and memory nodes.
			for _, file := range []string{"cpuset.cpus", "cpuset.mems"} {
				if v, err := os.ReadFile(filepath.Join(filepath.Dir(d), file)); err == nil {
					if err := os.WriteFile(filepath.Join(d, file), v, 0o644); err != nil {
						return fmt.Errorf("cgroup %s: %s: %w", d, file, err)
					}
				}
			}
		}
	}
	if len(n.cgroups) == 0 {
		return errors.New("no cgroup hierarchy mounted")
	}
	return nil
}

func (n *node) makeFolders() error {
	for _, p := range boundPaths {
		if err := os.MkdirAll(n.root(p), 0o755); err != nil {
			return err
		}
		if _, err := os.Stat(p); err == nil {
			continue
		}
		// The host lacks it: make the mount point, and remember the
		// topmost folder made, to remove it at the end.
		top := p
		for parent := filepath.Dir(top); parent != "/"; parent = filepath.Dir(parent) {
			if _, err := os.Stat(parent); err == nil {
				break
			}
			top = parent
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		n.created = append(n.created, top)
	}
	for key, value := range kernelDefaults {
		file := filepath.Join(n.dir, "sysctl", key)
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(file, []byte(value+"\n"), 0o644); err != nil {
			return err
		}
	}
	return os.MkdirAll(filepath.Join(n.dir, "logs"), 0o755)
}

// startHolder starts the process whose mount namespace the node's daemons
// share: private, so that nothing mounted in it reaches the host.
func (n *node) startHolder() error {
	var script strings.Builder
	script.WriteString("set -eu\nmount -t bpf bpf /sys/fs/bpf\n")
	for _, p := range boundPaths {
		fmt.Fprintf(&script, "mount --bind %s %s\n", n.root(p), p)
	}
	for key := range kernelDefaults {
		fmt.Fprintf(&script, "mount --bind %s /proc/sys/%s\n", filepath.Join(n.dir, "sysctl", key), key)
	}
	script.WriteString("echo ready\nexec sleep infinity\n")
	cmd := n.inCgroup("nsenter", "--net=/run/netns/"+n.netns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script.String())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	n.holder = cmd
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "ready\n" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return fmt.Errorf("mounts: %w (%q): %s", err, line, stderr.Bytes())
	}
	return nil
}

// inCgroup is a command that moves itself into the node's system cgroup
// in every hierarchy before it execs name.
func (n *node) inCgroup(name string, args ...string) *exec.Cmd {
	var procs []string
	for _, c := range n.cgroups {
		procs = append(procs, filepath.Join(c, "system", "cgroup.procs"))
	}
	// A process left outside the subtree would outlive stop: fail instead.
	script := `for f in ` + strings.Join(procs, " ") + `; do echo $$ > "$f" || exit 1; done; exec "$@"`
	return exec.Command("sh", append([]string{"-c", script, "sh", name}, args...)...)
}

// inNode is a command run in the node's network and mount namespaces.
func (n *node) inNode(name string, args ...string) *exec.Cmd {
	return n.inCgroup("nsenter", append([]string{"--target", strconv.Itoa(n.holder.Process.Pid), "--mount", "--net", "--", name}, args...)...)
}

// start starts a daemon of the node, its output to logs/<name>.log.
func (n *node) start(name string, env []string, bin string, args ...string) error {
	log, err := os.OpenFile(filepath.Join(n.dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := n.inNode(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append([]string{"PATH=" + n.runtimeDir() + ":" + n.bins + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + n.dir}, env...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	d := &daemon{cmd: cmd, done: make(chan struct{})}
	n.daemons[name] = d
	go func() {
		_ = cmd.Wait()
		close(d.done)
	}()
	return nil
}

// daemon is a process of the node; done is closed once it has exited.
type daemon struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// kill stops a daemon with sig and waits for it to exit.
func (n *node) kill(name string, sig syscall.Signal) {
	d := n.daemons[name]
	if d == nil {
		return
	}
	_ = d.cmd.Process.Signal(sig)
	select {
	case <-d.done:
	case <-time.After(30 * time.Second):
	}
	delete(n.daemons, name)
}

// logTail is the end of a daemon's log, for a failure's message.
func (n *node) logTail(name string, lines int) string {
	b, _ := os.ReadFile(filepath.Join(n.dir, "logs", name+".log"))
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

func (n *node) makePKI() error {
	p, err := newPKI(filepath.Join(n.dir, "pki"))
	if err != nil {
		return err
	}
	n.pki = p
	ips := []net.IP{net.ParseIP(nodeIP), net.ParseIP(serviceIP), net.ParseIP("127.0.0.1")}
	names := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"}
	for _, c := range []struct {
		name, cn string
		orgs     []string
		ips      []net.IP
		dns      []string
	}{
		{"apiserver", "kube-apiserver", nil, ips, names},
		{"admin", "e2e-admin", []string{"system:masters"}, nil, nil},
		{"kubelet", "system:node:" + nodeName, []string{"system:nodes"}, nil, nil},
	} {
		if err := p.issue(c.name, c.cn, c.orgs, c.ips, c.dns); err != nil {
			return err
		}
	}
	if err := p.serviceAccountKey(); err != nil {
		return err
	}
	server := "https://" + nodeIP + ":443"
	n.admin = filepath.Join(n.dir, "admin.kubeconfig")
	if err := p.kubeconfig(n.admin, "admin", server); err != nil {
		return err
	}
	return p.kubeconfig(filepath.Join(n.dir, "kubelet.kubeconfig"), "kubelet", server)
}

func (n *node) startEtcd() error {
	return n.start("etcd", nil, filepath.Join(n.testbin, "etcd"),
		"--data-dir", filepath.Join(n.dir, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "default=http://127.0.0.1:2380",
		// A test's cluster: losing it on a power cut costs nothing, and
		// fsync on a loaded machine costs seconds.
		"--unsafe-no-fsync")
}

func (n *node) startAPIServer(ctx context.Context) error {
	p := n.pki.path
	err := n.start("kube-apiserver", nil, filepath.Join(n.testbin, "kube-apiserver"),
		"--etcd-servers", "http://127.0.0.1:2379",
		// The Service's port is 443 and there is no kube-proxy: the server
		// listens on the Service's address and port itself.
		"--bind-address", "0.0.0.0", "--secure-port", "443", "--advertise-address", nodeIP,
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--cert-dir", filepath.Join(n.dir, "apiserver"),
		"--tls-cert-file", p("apiserver.crt"), "--tls-private-key-file", p("apiserver.key"),
		"--client-ca-file", p("ca.crt"),
		"--kubelet-client-certificate", p("admin.crt"), "--kubelet-client-key", p("admin.key"),
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p("sa.pub"), "--service-account-signing-key-file", p("sa.key"),
		"--authorization-mode", "Node,RBAC", "--allow-privileged=true",
		// The node's name resolves nowhere: reach the kubelet by its address.
		"--kubelet-preferred-address-types", "InternalIP")
	if err != nil {
		return err
	}
	if n.config, err = clientcmd.BuildConfigFromFlags("", n.admin); err != nil {
		return err
	}
	// Key pairs in memory: client-go reloads file-named ones in a goroutine
	// of its own, which outlives the node and logs for every look at the
	// removed files.
	if err := rest.LoadTLSFiles(n.config); err != nil {
		return fmt.Errorf("load the admin key pair: %w", err)
	}
	n.config.CertFile, n.config.KeyFile, n.config.CAFile = "", "", ""
	n.config.Dial = n.dial
	n.config.QPS, n.config.Burst = 50, 100
	if n.client, err = kubernetes.NewForConfig(n.config); err != nil {
		return err
	}
	return n.waitFor(ctx, "kube-apiserver", 3*time.Minute, func() (bool, error) {
		body, err := n.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
}

// dial opens a connection from inside the node's network namespace, where
// the API server and the pods' addresses are.
func (n *node) dial(ctx context.Context, network, address string) (net.Conn, error) {
	var conn net.Conn
	err := netns.Do(n.nsFile, func() error {
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, address)
		return err
	})
	return conn, err
}

func (n *node) startControllers() error {
	p := n.pki.path
	if err := n.start("kube-controller-manager", nil, filepath.Join(n.bins, "kube-controller-manager"),
		"--kubeconfig", n.admin, "--leader-elect=false", "--bind-address", "127.0.0.1",
		"--service-account-private-key-file", p("sa.key"), "--root-ca-file", p("ca.crt"),
		"--cert-dir", filepath.Join(n.dir, "kcm")); err != nil {
		return err
	}
	return n.start("kube-scheduler", nil, filepath.Join(n.bins, "kube-scheduler"),
		"--kubeconfig", n.admin, "--leader-elect=false", "--bind-address", "127.0.0.1",
		"--cert-dir", filepath.Join(n.dir, "scheduler"))
}

func (n *node) startContainerd(ctx context.Context) error {
	for _, plugin := range []string{"bridge", "host-local", "loopback", "multus"} {
		if err := copyFile(filepath.Join(n.bins, plugin), n.root("/opt/cni/bin/"+plugin), 0o755); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(n.root("/etc/cni/net.d/multus.d"), 0o755); err != nil {
		return err
	}
	if err := copyFile(n.admin, n.root("/etc/cni/net.d/multus.d/multus.kubeconfig"), 0o600); err != nil {
		return err
	}
	// Multus' thin plugin is the runtime's network; it delegates every
	// pod's primary network to the reference bridge and host-local, and
	// reads the secondary ones from NetworkAttachmentDefinitions.
	if err := os.WriteFile(n.root("/etc/cni/net.d/00-multus.conf"), []byte(`{
  "cniVersion": "1.0.0",
  "name": "multus-cni-network",
  "type": "multus",
  "kubeconfig": "/etc/cni/net.d/multus.d/multus.kubeconfig",
  "binDir": "/opt/cni/bin",
  "cniDir": "/var/lib/cni/multus",
  "logFile": "/var/lib/cni/multus.log",
  "logLevel": "verbose",
  "delegates": [{
    "cniVersion": "1.0.0",
    "name": "`+podNet+`",
    "plugins": [{
      "type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "`+podSubnet+`"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    }]
  }]
}
`), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.dir, "containerd.toml"), []byte(n.containerdConfig()), 0o644); err != nil {
		return err
	}
	return n.runContainerd(ctx)
}

// runtimeDir is the folder of the node's containerd, shim and ctr.
func (n *node) runtimeDir() string { return filepath.Join(n.bins, n.runtime.dir) }

// containerdConfig is the runtime's configuration in its own format: the
// same settings under 2.x's plugin names (version 3) and 1.6's (version 2).
func (n *node) containerdConfig() string {
	if n.runtime.configVersion >= 3 {
		return `version = 3
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = '` + podImage + `'
[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here: an oom_score_adj below containerd's own fails.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/opt/cni/bin']
    conf_dir = '/etc/cni/net.d'
[plugins.'io.containerd.nri.v1.nri']
  disable = true
`
	}
	return `version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + podImage + `"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
`
}

func (n *node) runContainerd(ctx context.Context) error {
	if err := n.start("containerd", nil, filepath.Join(n.runtimeDir(), "containerd"), "--config", filepath.Join(n.dir, "containerd.toml")); err != nil {
		return err
	}
	return n.waitFor(ctx, "containerd", 2*time.Minute, func() (bool, error) {
		_, err := n.ctr("version")
		return err == nil, nil
	})
}

// ctr runs containerd's client in the kubelet's containerd namespace.
func (n *node) ctr(args ...string) (string, error) {
	cmd := n.inNode(filepath.Join(n.runtimeDir(), "ctr"), append([]string{"--namespace", "k8s.io"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr // and a warning on every call that the host is cgroup v1
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w: %s%s", strings.Join(args, " "), err, out, bytes.TrimSpace(stderr.Bytes()))
	}
	return string(out), nil
}

func (n *node) startKubelet(ctx context.Context) error {
	config := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(config, []byte(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host: cgroup v1 with the unified hierarchy beside it, PID 1 not systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /`+n.cgroup+`
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
# Never write the host's kernel settings: the node's mount namespace shows
# the values kubelet wants.
protectKernelDefaults: true
makeIPTablesUtilChains: false
oomScoreAdj: 0
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
podLogsDir: /var/log/pods
resolvConf: /etc/resolv.conf
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: `+n.pki.path("ca.crt")+`}
authorization: {mode: AlwaysAllow}
# A shared machine's disk is what it is: evict and collect images only when
# it is truly full.
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`), 0o644); err != nil {
		return err
	}
	return n.runKubelet(ctx)
}

// runKubelet starts the kubelet on the configuration startKubelet wrote and
// waits for the node to be Ready.
func (n *node) runKubelet(ctx context.Context) error {
	if err := n.start("kubelet", nil, filepath.Join(n.bins, "kubelet"),
		"--config", filepath.Join(n.dir, "kubelet.yaml"), "--kubeconfig", filepath.Join(n.dir, "kubelet.kubeconfig"),
		"--hostname-override", nodeName, "--node-ip", nodeIP, "--v", "1"); err != nil {
		return err
	}
	return n.waitFor(ctx, "the node to be Ready", 3*time.Minute, func() (bool, error) {
		node, err := n.client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not registered yet: poll again
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
}

// waitFor polls cond every half second until it holds, fails, a daemon of
// the node exits, or timeout passes.
func (n *node) waitFor(ctx context.Context, what string, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		for name, d := range n.daemons {
			if d.exited() {
				return fmt.Errorf("waiting for %s: %s exited (%s):\n%s", what, name, d.cmd.ProcessState, n.logTail(name, 30))
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// stop ends every process of the node and removes all it made: its
// processes are exactly those of its cgroup subtree (pods, shims and
// daemons), so killing those leaves nothing behind.
func (n *node) stop(logf func(string, ...any)) {
	n.kill("kubelet", syscall.SIGTERM)
	if len(n.cgroups) > 0 {
		tree := n.cgroups[0]
		for range 100 {
			pids := cgroupPIDs(tree)
			if len(pids) == 0 {
				break
			}
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, c := range n.cgroups {
			removeCgroup(c, logf)
		}
	}
	if n.nsFile != nil {
		n.nsFile.Close()
	}
	if n.netns != "" {
		if out, err := run("ip", "netns", "del", n.netns); err != nil && !strings.Contains(out, "No such file") {
			logf("node: remove netns: %v", err)
		}
	}
	// Another node's mount namespace may be bound on these mount points:
	// removing them would unmount its folders from under it.
	if out, _ := run("ip", "netns", "list"); strings.Contains(out, "galactic-e2e-") {
		logf("node: another e2e node runs: leaving the mount points %v", n.created)
		n.created = nil
	}
	for _, p := range slices.Backward(n.created) {
		if err := removeEmptyTree(p); err != nil {
			logf("node: remove mount point %s: %v", p, err)
		}
	}
	if os.Getenv("GALACTICTEST_E2E_KEEP") == "1" {
		logf("node: kept %s", n.dir)
		return
	}
	if err := os.RemoveAll(n.dir); err != nil {
		logf("node: remove %s: %v", n.dir, err)
	}
}

func cgroupPIDs(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil //nolint:nilerr // a cgroup removed while walking has no processes
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for f := range strings.FieldsSeq(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}

func removeCgroup(dir string, logf func(string, ...any)) {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for _, d := range slices.Backward(dirs) {
		var err error
		for range 50 {
			if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, syscall.ENOENT) {
			logf("node: remove cgroup %s: %v", d, err)
		}
	}
}

// removeEmptyTree removes p and the empty folders under it, and fails on
// anything else: a mount point the node made must come back empty.
func removeEmptyTree(p string) error {
	entries, err := os.ReadDir(p)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() {
			return fmt.Errorf("%s is not empty", p)
		}
		if err := removeEmptyTree(filepath.Join(p, e.Name())); err != nil {
			return err
		}
	}
	return syscall.Rmdir(p)
}

func copyFile(from, to string, mode os.FileMode) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	tmp := to + ".tmp"
	if err := os.WriteFile(tmp, b, mode); err != nil {
		return err
	}
	return os.Rename(tmp, to)
}
