package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	authnv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/datum-cloud/galactic-node/hubctl"
	"github.com/datum-cloud/galactic-node/node/netns"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
	"github.com/datum-cloud/galactic-node/test/framework/syncbuf"
)

// The container-runtime tests run the built images in podman with runc, as
// the kubelet would run the manifests of the default build: every field of
// the container spec is translated to podman's flags or refused, so the
// manifests cannot drift from what was run. A network namespace stands in
// for the node, test folders for its host paths, and a TokenRequest token
// of the component's own service account for the kubelet's projected one.

// imageDir holds the archives `make images` writes.
func imageDir() string {
	if d := os.Getenv("GALACTICTEST_IMAGE_DIR"); d != "" {
		return d
	}
	return "../bin"
}

// podmanCmd runs podman with the flags this machine's runtime needs: runc,
// and ulimits runc can set inside this sandbox.
func podmanCmd(args ...string) *exec.Cmd {
	return exec.Command("podman", append([]string{"--runtime", "runc"}, args...)...)
}

// requirePodman fails under CI, where .ci/run installs podman and runc, and
// skips elsewhere when they are missing.
func requirePodman(t *testing.T) {
	t.Helper()
	nettest.RequirePrivileged(t)
	for _, tool := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			msg := tool + " is missing: apt-get install podman runc (.ci/run does)"
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

// loadImage loads bin/<name>.oci.tar into podman's store and returns its ID.
func loadImage(t *testing.T, name string) string {
	t.Helper()
	archive := filepath.Join(imageDir(), name+".oci.tar")
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("%v: run `make images` first (make test does)", err)
	}
	out, err := podmanCmd("load", "-q", "-i", archive).CombinedOutput()
	if err != nil {
		t.Fatalf("podman load %s: %v\n%s", archive, err, out)
	}
	m := regexp.MustCompile(`Loaded image(?:\(s\))?: (\S+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("podman load %s: no image named in %q", archive, out)
	}
	ref := string(m[1])
	id, err := podmanCmd("image", "inspect", "--format", "{{.Id}}", ref).Output()
	if err != nil {
		t.Fatalf("podman image inspect %s: %v", ref, err)
	}
	if !strings.HasPrefix(ref, "ghcr.io/datum-cloud/"+name) {
		t.Fatalf("the archive names %s, want ghcr.io/datum-cloud/%s", ref, name)
	}
	// Each build is a new image: a machine that runs the tests often would
	// keep every one of them in podman's store.
	t.Cleanup(func() { _ = podmanCmd("rmi", "--force", ref).Run() })
	return strings.TrimSpace(string(id))
}

// kubeletScene is what the kubelet would give a pod on the stand-in node.
type kubeletScene struct {
	netns     string            // the pod's network namespace (the node's, for hostNetwork)
	hostPaths map[string]string // volume name → test folder standing in for it
	fieldRefs map[string]string // fieldPath → value
	saDir     string            // projected service account token, CA and namespace
	apiServer string            // host:port the pod reaches the API server at
	hostname  string
	imageID   string
	// seccompRoot stands in for the kubelet's seccomp folder.
	seccompRoot string
	extraArgs   []string // after the manifest's args: the test's overrides, named in each test
	containerN  string
}

// podmanRun translates c of spec into `podman run` arguments.
func podmanRun(t *testing.T, spec *corev1.PodSpec, c corev1.Container, s kubeletScene) []string {
	t.Helper()
	args := []string{"run", "--name", s.containerN, "--hostname", s.hostname,
		"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
		"--network", "ns:" + s.netns}
	if spec.HostPID {
		t.Fatalf("%s: hostPID is not translated", c.Name)
	}
	psc := spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	seccomp := psc.SeccompProfile
	csc := c.SecurityContext
	if csc == nil {
		csc = &corev1.SecurityContext{}
	}
	if csc.SeccompProfile != nil {
		seccomp = csc.SeccompProfile
	}
	switch {
	case seccomp != nil && seccomp.Type == corev1.SeccompProfileTypeRuntimeDefault:
		// podman's default profile is its RuntimeDefault.
	case seccomp != nil && seccomp.Type == corev1.SeccompProfileTypeLocalhost && seccomp.LocalhostProfile != nil:
		// Read from the kubelet's seccomp folder when the container is
		// created, as the kubelet's runtime does.
		args = append(args, "--security-opt", "seccomp="+filepath.Join(s.seccompRoot, *seccomp.LocalhostProfile))
	default:
		t.Fatalf("%s: seccomp %+v: only RuntimeDefault and Localhost are translated", c.Name, seccomp)
	}
	if csc.Privileged != nil && *csc.Privileged {
		t.Fatalf("%s: privileged is not translated", c.Name)
	}
	user := psc.RunAsUser
	if csc.RunAsUser != nil {
		user = csc.RunAsUser
	}
	group := psc.RunAsGroup
	if csc.RunAsGroup != nil {
		group = csc.RunAsGroup
	}
	nonRoot := (psc.RunAsNonRoot != nil && *psc.RunAsNonRoot) || (csc.RunAsNonRoot != nil && *csc.RunAsNonRoot)
	if user != nil {
		u := strconv.FormatInt(*user, 10)
		if group != nil {
			u += ":" + strconv.FormatInt(*group, 10)
		}
		args = append(args, "--user", u)
	}
	if nonRoot && (user == nil || *user == 0) {
		t.Fatalf("%s: runAsNonRoot with user %v", c.Name, user)
	}
	if csc.AllowPrivilegeEscalation != nil && !*csc.AllowPrivilegeEscalation {
		args = append(args, "--security-opt", "no-new-privileges")
	}
	if csc.ReadOnlyRootFilesystem != nil && *csc.ReadOnlyRootFilesystem {
		// podman would otherwise mount tmpfs on /tmp, /run and /var/tmp;
		// the kubelet does not.
		args = append(args, "--read-only", "--read-only-tmpfs=false")
	}
	if caps := csc.Capabilities; caps != nil {
		for _, d := range caps.Drop {
			args = append(args, "--cap-drop", string(d))
		}
		for _, a := range caps.Add {
			args = append(args, "--cap-add", string(a))
		}
	}
	if m, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		args = append(args, "--memory", strconv.FormatInt(m.Value(), 10))
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			t.Fatalf("%s: mount of undeclared volume %s", c.Name, m.Name)
		}
		host, ok := s.hostPaths[m.Name]
		if !ok {
			t.Fatalf("%s: volume %s (%+v) has no stand-in in the test", c.Name, m.Name, v.VolumeSource)
		}
		opt := "rw"
		if m.ReadOnly {
			opt = "ro"
		}
		args = append(args, "--volume", host+":"+m.MountPath+":"+opt)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		args = append(args, "--volume", s.saDir+":/var/run/secrets/kubernetes.io/serviceaccount:ro")
		host, port, _ := net.SplitHostPort(s.apiServer)
		args = append(args, "--env", "KUBERNETES_SERVICE_HOST="+host, "--env", "KUBERNETES_SERVICE_PORT="+port)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			v, ok := s.fieldRefs[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				t.Fatalf("%s: env %s from field %s has no value in the test", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = v
		default:
			t.Fatalf("%s: env %s: only values and field references are translated", c.Name, e.Name)
		}
		args = append(args, "--env", e.Name+"="+env[e.Name])
	}
	if len(c.Command) > 0 {
		b, _ := json.Marshal(c.Command)
		args = append(args, "--entrypoint", string(b))
	}
	args = append(args, s.imageID)
	// The kubelet expands $(VAR) in args from the container's env.
	expand := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, a := range c.Args {
		args = append(args, expand.ReplaceAllStringFunc(a, func(ref string) string {
			if v, ok := env[ref[2:len(ref)-1]]; ok {
				return v
			}
			return ref
		}))
	}
	return append(args, s.extraArgs...)
}

// serviceAccountDir writes what the kubelet projects for a pod of
// serviceaccount galactic-system/sa: a TokenRequest token, the cluster's
// CA and the namespace.
func serviceAccountDir(t *testing.T, c *clustertest.Cluster, sa string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("galactic-system").CreateToken(context.Background(), sa,
		&authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s: %v", sa, err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": c.Config.CAData, "namespace": []byte("galactic-system")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The kubelet's projected volume is readable by the pod's user.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func ptrTo[T any](v T) *T { return &v }

// apiServerAddr is the host:port of the cluster's API server.
func apiServerAddr(t *testing.T, c *clustertest.Cluster) string {
	t.Helper()
	u, err := url.Parse(c.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// applyRBAC applies the service accounts and RBAC of the default build for
// real: the containers run with exactly what the install grants.
func applyRBAC(t *testing.T, a *applier) {
	t.Helper()
	for _, obj := range build(t, "../deploy") {
		switch obj.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := a.apply(obj, false); err != nil {
				t.Fatalf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		}
	}
}

// configMapData returns the data of the named ConfigMap of the default build.
func configMapData(t *testing.T, name string) map[string]string {
	t.Helper()
	for _, obj := range build(t, "../deploy") {
		if obj.GetKind() == "ConfigMap" && obj.GetName() == name {
			data, _, _ := unstructured.NestedStringMap(obj.Object, "data")
			return data
		}
	}
	t.Fatalf("the default build has no ConfigMap %s", name)
	return nil
}

// container is a started podman container, removed when t ends.
type container struct {
	name string
	log  syncbuf.Buffer // read while podman still writes it
	cmd  *exec.Cmd
}

func startContainer(t *testing.T, runArgs []string) *container {
	t.Helper()
	c := &container{name: runArgs[2]}
	c.cmd = podmanCmd(runArgs...)
	c.cmd.Stdout, c.cmd.Stderr = &c.log, &c.log
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = podmanCmd("rm", "-f", "-t", "5", c.name).Run()
		_ = c.cmd.Wait()
		if t.Failed() {
			t.Logf("container %s log:\n%s", c.name, c.log.String())
		}
	})
	return c
}

// httpIn is an HTTP client whose connections are made inside ns.
func httpIn(ns *nettest.NS) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := netns.Do(ns.File, func() error {
				var err error
				conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		}}}
}

func get(t *testing.T, client *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor polls until cond holds, failing t with what after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// portOf resolves a container's named port.
func portOf(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port %s", c.Name, name)
	return 0
}

// TestTheNodeImageRunsAsTheDaemonSetRunsIt runs the install-cni init
// container and the daemon from the built image with the DaemonSet's spec,
// against the real API server with the daemon's own RBAC. The daemon
// reclaims a stale tap over two passes and keeps a held one, its metrics
// and probes answer on the manifest's port, and the plugin the init
// container dropped is driven through libcni.
//
// Departures from the DaemonSet, each needed to run it in a test:
// --min-candidate-age=0 (else the test waits 5 min) and --interval=0 (the
// test's forced passes are the only ones, so "two passes" is exact).
func TestTheNodeImageRunsAsTheDaemonSetRunsIt(t *testing.T) {
	requirePodman(t)
	nettest.RequireTCX(t) // the installed plugin's ADD attaches the datapath program
	image := loadImage(t, "galactic-node")
	ds, tmpl := workload(t, "DaemonSet", "galactic-node")
	_ = ds
	spec := &tmpl.Spec
	if !spec.HostNetwork {
		t.Fatal("the DaemonSet is not on the host network: the taps are in the host's namespace")
	}

	a := newApplier(t)
	applyRBAC(t, a)
	cluster := sharedWithLiveAttachment(t) // a/1 lives, so the inventory is healthy
	n := newNode(t)
	apiServer := apiServerAddr(t, cluster)
	nettest.ForwardLoopback(t, n.ns, apiServer)

	// Host folders of the stand-in node.
	root := t.TempDir()
	seccompRoot := filepath.Join(root, "var/lib/kubelet/seccomp")
	hostPaths := map[string]string{"bpffs": n.bpffs, "seccomp": filepath.Join(seccompRoot, "galactic")}
	for _, v := range []string{"run-galactic", "cni-bin", "cni-conf", "cni-conflist", "admin-tokens", "seccomp", "cli", "cni-records", "node-state", "cni-cache", "cni-cache-multus"} {
		if hostPaths[v] == "" {
			hostPaths[v] = filepath.Join(root, v)
		}
		if err := os.MkdirAll(hostPaths[v], 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The host's tun device, through which the daemon probes taps.
	hostPaths["dev-net-tun"] = "/dev/net/tun"
	// The admin socket's folder must be private to its owner (root).
	if err := os.Chmod(hostPaths["run-galactic"], 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range configMapData(t, "galactic-cni-conflist") {
		if err := os.WriteFile(filepath.Join(hostPaths["cni-conflist"], name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A node an older install left galactic's conflist on, before its
	// primary network's: the upgrade removes it.
	copyTree(t, "testdata/net.d/kindnet", hostPaths["cni-conf"])
	if err := os.WriteFile(filepath.Join(hostPaths["cni-conf"], "10-galactic.conflist"), []byte(olderConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	tokens, err := os.ReadFile(n.tokens)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hostPaths["admin-tokens"], "tokens"), tokens, 0o400); err != nil {
		t.Fatal(err)
	}
	n.socket = filepath.Join(hostPaths["run-galactic"], "admin.sock")

	scene := kubeletScene{netns: "/run/netns/" + n.ns.Name, hostPaths: hostPaths, hostname: "node-a",
		fieldRefs: map[string]string{"spec.nodeName": "node-a"}, saDir: serviceAccountDir(t, cluster, spec.ServiceAccountName),
		apiServer: apiServer, imageID: image, seccompRoot: seccompRoot}

	// The init container: install-cni, run to completion.
	if len(spec.InitContainers) != 1 {
		t.Fatalf("%d init containers, want install-cni", len(spec.InitContainers))
	}
	scene.containerN = "galactic-test-install-cni-" + n.ns.Name
	initCtr := startContainer(t, podmanRun(t, spec, spec.InitContainers[0], scene))
	if err := initCtr.cmd.Wait(); err != nil {
		t.Fatalf("install-cni: %v\n%s", err, initCtr.log.String())
	}
	plugin := filepath.Join(hostPaths["cni-bin"], "galactic-tap")
	if fi, err := os.Stat(plugin); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Fatalf("install-cni left no executable plugin: %v", err)
	}
	// The plugin alone: the runtime's folder is left to the primary
	// network, whose file gives every pod its network again.
	if got := treeNames(tree(t, hostPaths["cni-conf"])); len(got) != 1 || got[0] != "10-kindnet.conflist" {
		t.Fatalf("install-cni left the runtime's folder holding %v, want kindnet's conflist alone\n%s", got, initCtr.log.String())
	}
	if !strings.Contains(initCtr.log.String(), "removed the conflist an older install put") {
		t.Errorf("install-cni did not log the older conflist it removed:\n%s", initCtr.log.String())
	}

	// Taps: a stale one (no attachment carries a/2), and a held one whose
	// identity is as stale (a/3) but that a VMM holds open.
	const stale, held = "G00000000a002H", "G00000000a003H"
	n.stampedTap(stale, "sandbox-2", tun.Mode{})
	n.stampedTap(held, "sandbox-3", tun.Mode{})
	nettest.Hold(t, n.ns, held, nettest.HoldOptions{})
	// Single-queue ones, carrier forced off: only the kernel probe, through
	// the host's tun device mounted into the container, tells them apart.
	const staleSQ, heldSQ = "G00000000a004H", "G00000000a005H"
	n.stampedTap(staleSQ, "sandbox-4", tun.Mode{SingleQueue: true})
	n.stampedTap(heldSQ, "sandbox-5", tun.Mode{SingleQueue: true})
	nettest.HoldInFlight(t, n.ns, heldSQ, tun.Mode{SingleQueue: true})
	n.ns.IP(t, "link", "set", heldSQ, "carrier", "off")

	// The daemon.
	scene.containerN = "galactic-test-node-" + n.ns.Name
	// Three of the scene's five taps are candidates on purpose: the
	// mass-removal brake, which would hold them, has tests of its own
	// (brake_test.go), so it is off here.
	scene.extraArgs = []string{"--min-candidate-age=0", "--interval=0", "--mass-removal-share=1", "--inventory-shrink-share=1"}
	c := spec.Containers[0]
	daemon := startContainer(t, podmanRun(t, spec, c, scene))
	client := httpIn(n.ns)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d", portOf(t, c, "metrics"))
	for _, probe := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
		waitFor(t, "probe "+probe.HTTPGet.Path, func() bool {
			if daemon.cmd.ProcessState != nil {
				t.Fatalf("the daemon exited:\n%s", daemon.log.String())
			}
			code, _ := get(t, client, fmt.Sprintf("http://127.0.0.1:%d%s", portOf(t, c, probe.HTTPGet.Port.StrVal), probe.HTTPGet.Path))
			return code == http.StatusOK
		})
	}

	// The daemon recorded the pins' layout where the init container,
	// run again (a restart of the pod), checks its plugin against it.
	if _, err := os.Stat(filepath.Join(hostPaths["run-galactic"], "datapath-layout")); err != nil {
		t.Fatalf("the daemon recorded no layout for install-cni: %v", err)
	}
	initAgain := scene
	initAgain.containerN, initAgain.extraArgs = "galactic-test-install-cni-again-"+n.ns.Name, nil
	again := startContainer(t, podmanRun(t, spec, spec.InitContainers[0], initAgain))
	if err := again.cmd.Wait(); err != nil || !strings.Contains(again.log.String(), "of this build's layout") {
		t.Fatalf("install-cni over the daemon's pins: %v\n%s", err, again.log.String())
	}

	first := n.force("")
	if first.Result != "completed" || !n.exists(stale) || !n.exists(held) {
		t.Fatalf("first pass: %+v; a pass must only mark (stale present %v)", first, n.exists(stale))
	}
	second := n.force("")
	if len(second.Reclaimed) != 2 || second.Reclaimed[0].Name != stale || second.Reclaimed[1].Name != staleSQ {
		t.Fatalf("second pass reclaimed %+v, want %s and %s\n%s", second.Reclaimed, stale, staleSQ, daemon.log.String())
	}
	if n.exists(stale) || n.exists(staleSQ) || !n.exists(held) || !n.exists(heldSQ) {
		t.Fatalf("after two passes: stale present %v %v, held present %v %v", n.exists(stale), n.exists(staleSQ), n.exists(held), n.exists(heldSQ))
	}

	code, body := get(t, client, metricsURL+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("scrape: %d %s", code, body)
	}
	// The held single-queue tap was confirmed, kept at the kernel probe,
	// and starts over: nothing is pending until the next pass marks it.
	for _, want := range []string{"galactic_cni_stale_taps_reclaimed_total 2", "galactic_cni_stale_taps_pending 0", "galactic_ebpf_map_max_entries{"} {
		if !strings.Contains(body, want) {
			t.Errorf("the scrape lacks %q", want)
		}
	}

	// The plugin install-cni dropped, through libcni with the network of
	// the NetworkAttachmentDefinition deploy/ ships, as Multus runs it.
	// Its host paths are the stand-in node's folders, the bridge stands in
	// for the VRF this kernel lacks, and the identity is the attachment's.
	list := installedConflist(t, []byte(exampleNADConfig(t)), map[string]any{
		"bpffs": n.bpffs, "vrfLockDir": filepath.Join(hostPaths["run-galactic"], "vrf"), "dataDir": filepath.Join(root, "cni-state"),
		"master": "bridge", "vpc": "a", "vpcAttachment": "4", "routes": routesOf("4"), "gateway": map[string]string{"ipv4": "10.10.0.254"},
	})
	ctr := nettest.NewNS(t)
	cni := libcni.NewCNIConfigWithCacheDir([]string{hostPaths["cni-bin"]}, t.TempDir(), nil)
	rt := &libcni.RuntimeConf{ContainerID: strings.Repeat("c", 64), NetNS: "/run/netns/" + ctr.Name, IfName: "eth0"}
	in := func(fn func(ctx context.Context) error) error {
		return netns.Do(n.ns.File, func() error { return fn(context.Background()) })
	}
	if err := in(func(ctx context.Context) error { _, err := cni.AddNetworkList(ctx, list, rt); return err }); err != nil {
		t.Fatalf("libcni ADD through the installed plugin: %v", err)
	}
	if !n.exists("G00000000a004H") {
		t.Fatal("ADD made no tap")
	}
	if err := in(func(ctx context.Context) error { return cni.CheckNetworkList(ctx, list, rt) }); err != nil {
		t.Fatalf("libcni CHECK: %v", err)
	}
	if err := in(func(ctx context.Context) error { return cni.DelNetworkList(ctx, list, rt) }); err != nil {
		t.Fatalf("libcni DEL: %v", err)
	}
	if n.exists("G00000000a004H") {
		t.Fatal("DEL left the tap")
	}

	// What the runbooks run on the node: the CLI install-cni put on the
	// host, as root, through the host's socket.
	cliOut, err := exec.Command(filepath.Join(hostPaths["cli"], "galactic-node"), "status", "--socket", n.socket).CombinedOutput()
	if err != nil || !strings.Contains(string(cliOut), "ready:") {
		t.Errorf("the CLI install-cni put on the host: %v\n%s", err, cliOut)
	}

	// What the runbooks run through `kubectl exec` into the pod: the
	// image's own binary as its client, no shell, root with no token.
	for _, args := range [][]string{{"status"}, {"taps", "-o", "json"}, {"pass", "--dry-run"}} {
		out, err := podmanCmd(append([]string{"exec", scene.containerN, "galactic-node"}, args...)...).CombinedOutput()
		if err != nil {
			t.Errorf("exec galactic-node %v in the pod: %v\n%s", args, err, out)
		}
	}

	// SIGTERM, as the kubelet stops it: the daemon stops within its grace.
	start := time.Now()
	if out, err := podmanCmd("stop", "-t", strconv.FormatInt(*spec.TerminationGracePeriodSeconds, 10), scene.containerN).CombinedOutput(); err != nil {
		t.Fatalf("podman stop: %v\n%s", err, out)
	}
	_ = daemon.cmd.Wait()
	if !strings.Contains(daemon.log.String(), `"msg":"stopped"`) {
		t.Errorf("the daemon did not stop cleanly on SIGTERM in %s:\n%s", time.Since(start), daemon.log.String())
	}
}

// installedConflist parses a conflist and sets fields on its galactic-tap
// plugin.
func installedConflist(t *testing.T, data []byte, set map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	plugins, _ := raw["plugins"].([]any)
	if len(plugins) == 0 {
		t.Fatal("the conflist has no plugins")
	}
	p := plugins[0].(map[string]any)
	for k, v := range set {
		p[k] = v
	}
	b, _ := json.Marshal(raw)
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// TestTheHubImageRunsAsTheDeploymentRunsIt runs the built hubctl image with
// the Deployment's spec (non-root, read-only root, its args) in a network
// namespace standing in for the pod's, against the real API server with
// the hub's own RBAC: it takes the Lease, becomes ready, claims a fabric
// identity for a new network, and serves its metrics.
func TestTheHubImageRunsAsTheDeploymentRunsIt(t *testing.T) {
	requirePodman(t)
	image := loadImage(t, "galactic-hubctl")
	_, tmpl := workload(t, "Deployment", "galactic-hubctl")
	spec := &tmpl.Spec
	a := newApplier(t)
	applyRBAC(t, a)
	cluster := a.c
	ns := nettest.NewNS(t)
	apiServer := apiServerAddr(t, cluster)
	nettest.ForwardLoopback(t, ns, apiServer)

	c := spec.Containers[0]
	name := "galactic-hubctl-test-" + ns.Name
	scene := kubeletScene{netns: "/run/netns/" + ns.Name, hostname: name, saDir: serviceAccountDir(t, cluster, spec.ServiceAccountName),
		apiServer: apiServer, imageID: image, containerN: name}
	hub := startContainer(t, podmanRun(t, spec, c, scene))

	var inspect []string
	waitFor(t, "the hub container", func() bool {
		out, err := podmanCmd("inspect", "--format", "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}}", name).Output()
		inspect = strings.Fields(string(out))
		return err == nil && len(inspect) == 2
	})
	if inspect[0] == "0" || strings.HasPrefix(inspect[0], "0:") || inspect[1] != "true" {
		t.Fatalf("hub container user %s, read-only root %s: want non-root and read-only", inspect[0], inspect[1])
	}

	client := httpIn(ns)
	metrics := fmt.Sprintf("http://127.0.0.1:%d", portOf(t, c, "metrics"))
	waitFor(t, "the hub's readiness", func() bool {
		if hub.cmd.ProcessState != nil {
			t.Fatalf("hubctl exited:\n%s", hub.log.String())
		}
		code, _ := get(t, client, metrics+c.ReadinessProbe.HTTPGet.Path)
		return code == http.StatusOK
	})
	cs, _ := kubernetes.NewForConfig(cluster.Config)
	waitFor(t, "the hub to hold the Lease", func() bool {
		var l *coordinationv1.Lease
		l, err := cs.CoordinationV1().Leases("platform").Get(context.Background(), "galactic-hubctl", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == name
	})

	tenant := "tenant-" + ns.Name
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tenant}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cluster.Apply(t, hubctl.NetworkResource, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.datumapis.com/v1alpha", "kind": "Network",
		"metadata": map[string]any{"namespace": tenant, "name": "net-1"}, "spec": map[string]any{},
	}})
	claim := "fabric-identity." + tenant + ".net-1"
	waitFor(t, "the hub to claim the network's fabric identity", func() bool {
		_, err := cluster.Client.Resource(hubctl.ClaimResource).Namespace("platform").Get(context.Background(), claim, metav1.GetOptions{})
		return err == nil
	})
	code, body := get(t, client, metrics+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, "galactic_hub_") {
		t.Fatalf("hub scrape: %d %s", code, body)
	}
}
