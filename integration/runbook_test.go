package integration

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// runbookSections are the sections of docs/operations.md whose commands an
// operator runs against a running node.
var runbookSections = []string{"Enabling the reclaim", "Runbooks"}

// shBlock is a ```sh fenced block, indented or not (a block may sit in a
// list item).
var shBlock = regexp.MustCompile("(?ms)^([ \t]*)```sh\n(.*?)\n[ \t]*```[ \t]*$")

// inlineNodeCommand is an inline code span that is a node command: the
// text may name one only if a block runs it.
var inlineNodeCommand = regexp.MustCompile("`((api|curl|ip|ls|pgrep) [^`]*|galactic-node (status|taps|pending|passes|pass|maps|rows|drops)\\b[^`]*)`")

// podFinder is the one line that finds the galactic-node pod of $NODE.
var podFinder = regexp.MustCompile(`^POD=\$\(kubectl .*\)$`)

// kubectlExec is a kubectl exec into that pod: what follows -- runs in the
// image, which has no shell.
var kubectlExec = regexp.MustCompile(`^kubectl (.* )?exec (.* )?-- (.+)$`)

// runbookBlocks returns the sh blocks of the runbook sections, dedented,
// with backslash-continued lines joined, and fails on a node command named
// inline that no block runs.
func runbookBlocks(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var inline [][]string
	for _, name := range runbookSections {
		_, section, ok := strings.Cut(string(doc), "\n## "+name+"\n")
		if !ok {
			t.Fatalf("docs/operations.md has no %q section", name)
		}
		if i := strings.Index(section, "\n## "); i >= 0 {
			section = section[:i]
		}
		for _, m := range shBlock.FindAllStringSubmatch(section, -1) {
			var lines []string
			for _, l := range strings.Split(m[2], "\n") {
				lines = append(lines, strings.TrimPrefix(l, m[1]))
			}
			blocks = append(blocks, strings.ReplaceAll(strings.Join(lines, "\n"), "\\\n", ""))
		}
		inline = append(inline, inlineNodeCommand.FindAllStringSubmatch(shBlock.ReplaceAllString(section, ""), -1)...)
	}
	// A node command the text names inline must be one a block runs.
	var lines []string
	for _, b := range blocks {
		lines = append(lines, commands(b)...)
	}
	for _, m := range inline {
		ran := false
		for _, l := range lines {
			ran = ran || strings.HasPrefix(l, m[1])
		}
		if !ran {
			t.Errorf("%s is a node command no sh block runs, so nothing checks it: put it in a block", m[0])
		}
	}
	return blocks
}

// commands returns a block's command lines: no blanks, no comment lines.
func commands(block string) []string {
	var out []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// TestRunbookCommandsRunWhereTheySay runs every command block of
// docs/operations.md's "Enabling the reclaim" and "Runbooks" sections as
// written, where the docs say it runs.
//
// Where a block runs is read from its lines:
//
//   - A block none of whose lines calls kubectl runs on the node: the
//     scene of hack/demo.sh (a netns, a bridge G00000000aV standing in for
//     the VRF, a held tap, a live one, a stale candidate, the daemon with an
//     inventory file), as root, with the built galactic-node first on PATH
//     and the daemon's admin socket at its default path,
//     /run/galactic/admin.sock: each block and the daemon run in the netns
//     and in a private mount namespace where a temp folder is bound over
//     /run/galactic, so the host's is never touched.
//   - A block that calls kubectl must consist of kubectl lines only, each
//     either the pod finder `POD=$(kubectl ...)`, which runs for real with
//     kubectl against the test API server holding galactic-node pods on
//     node-a and node-b and must print node-a's, or `kubectl ... exec ... --
//     CMD`, where CMD runs in the image: it must be galactic-node itself
//     (the image has no shell, so no sh, bash or curl), and it runs on the
//     node scene as the pod would run it (the pod shares the host's
//     /run/galactic). Other kubectl steps stay inline in the text.
//
// The variables the runbooks name are set to the scene's: NODE (node-a),
// TAP and IFINDEX (the stale tap), APISERVER (the test API server, reached
// from the netns). A node command left in inline code fails the test: only
// blocks are run.
func TestRunbookCommandsRunWhereTheySay(t *testing.T) {
	blocks := runbookBlocks(t)
	kubectl := kubectlBinary(t)
	cluster := clustertest.Shared(t)
	for _, tool := range []string{"unshare", "mount", "curl", "pgrep"} {
		if _, err := exec.LookPath(tool); err != nil {
			// Not a skip: a runbook that cannot be run is not checked.
			t.Fatalf("the runbooks' scene needs %s on PATH: %v", tool, err)
		}
	}
	if len(blocks) == 0 {
		t.Fatal("the runbook sections have no sh block")
	}

	s := newRunbookScene(t, cluster)
	env := append(os.Environ(),
		"PATH="+filepath.Dir(binary)+":"+filepath.Dir(kubectl)+":"+os.Getenv("PATH"),
		"KUBECONFIG="+writeKubeconfig(t, cluster.Config),
		"NODE=node-a", "TAP="+s.tap, "IFINDEX="+s.ifindex, "APISERVER="+s.apiserver)
	finders, execs := 0, 0
	for i, block := range blocks {
		lines := commands(block)
		if !strings.Contains(block, "kubectl") {
			s.onNode(t, env, i, block)
			continue
		}
		for _, line := range lines {
			switch m := kubectlExec.FindStringSubmatch(line); {
			case podFinder.MatchString(line):
				finders++
				out, err := runIn(env, "", line+"\nprintf %s \"$POD\"")
				if err != nil || out != "pod/"+s.podA {
					t.Errorf("block %d: the pod finder printed %q (%v), want exactly pod/%s of node-a\n$ %s", i+1, out, err, s.podA, line)
				}
			case m != nil:
				execs++
				inPod := strings.Fields(m[3])
				for _, f := range inPod {
					if f == "sh" || f == "bash" || f == "curl" || f == "awk" {
						t.Errorf("block %d: %q runs %s in the pod, whose image has no shell and no %s", i+1, line, f, f)
					}
				}
				if !strings.Contains(line, `"$POD"`) || !strings.Contains(line, "-c galactic-node ") {
					t.Errorf("block %d: %q execs into something other than \"$POD\"'s galactic-node container", i+1, line)
				}
				if inPod[0] != "galactic-node" {
					t.Errorf("block %d: %q runs %s in the pod; the image holds galactic-node", i+1, line, inPod[0])
					continue
				}
				s.onNode(t, env, i, m[3])
			default:
				t.Errorf("block %d: %q calls kubectl but is neither the pod finder nor an exec into the pod: keep kubectl-only steps inline", i+1, line)
			}
		}
	}
	if finders == 0 || execs == 0 {
		t.Errorf("the runbooks say how to reach the pod %d times and exec into it %d times; want both", finders, execs)
	}
}

// runbookScene is the demo's node with its daemon at the default socket
// path, and the cluster's two galactic-node pods.
type runbookScene struct {
	n            *node
	run          string // bound over /run/galactic in every mount namespace of the scene
	tap, ifindex string // the stale tap
	apiserver    string // the API server's URL inside the netns
	podA         string
}

func newRunbookScene(t *testing.T, cluster *clustertest.Cluster) *runbookScene {
	t.Helper()
	nettest.RequireTCX(t) // its taps are added as CNI ADD adds them
	// The bind needs a target; the host's folder is made if missing (the
	// daemon's default) and removed again if the test made it.
	if _, err := os.Stat("/run/galactic"); os.IsNotExist(err) {
		if err := os.Mkdir("/run/galactic", 0o750); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove("/run/galactic") })
	}
	n := newNode(t)
	s := &runbookScene{n: n, run: filepath.Join(n.dir, "run"), tap: "G00000000a003H"}
	if err := os.Mkdir(s.run, 0o750); err != nil {
		t.Fatal(err)
	}
	// The demo's taps, made as CNI ADD makes them, with their VRF locks
	// where the daemon, at its defaults, looks: /run/galactic/vrf.
	for _, att := range []string{"1", "2", "3"} {
		args := []string{"netns", "exec", n.ns.Name, binary, "tap", "add", "--vpc", "a", "--attachment", att, "--owner", "sandbox-" + att,
			"--master", "bridge", "--table", "1010", "--route", "10.10.0." + att + "/32", "--gateway4", "10.10.0.254", "--host-port", "udp/53",
			"--bpffs", n.bpffs, "--vrf-lock-dir", filepath.Join(s.run, "vrf")}
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("tap add %s: %v: %s", att, err, out)
		}
	}
	n.ns.IP(t, "link", "show", "G00000000aV") // the bridge standing in for the VRF
	nettest.Hold(t, n.ns, "G00000000a001H", nettest.HoldOptions{Mode: tun.Mode{}})
	s.ifindex = n.ifindex(s.tap)

	// The daemon runs as the DaemonSet runs it: socket and locks at their
	// defaults under /run/galactic. start passes its own --admin-socket
	// first; the later flag wins. The test itself reaches the same socket
	// through the bound folder.
	wrapper := filepath.Join(n.dir, "in-run-galactic")
	script := "#!/bin/sh\nexec unshare --mount --propagation private sh -c 'mount --bind \"$0\" /run/galactic && exec \"$@\"' " +
		shellQuote(s.run) + " " + shellQuote(binary) + " \"$@\"\n"
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	n.bin = wrapper
	n.socket = filepath.Join(s.run, "admin.sock")
	inv := n.writeInventory("apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: web-2, namespace: tenant-a}\n" +
		"status: {vpc: \"a\", vpcAttachment: \"2\", node: node-a, hostInterface: G00000000a002H}\n")
	_, log := n.start("--inventory-file", inv, "--admin-socket", "/run/galactic/admin.sock", "--vrf-lock-dir", "/run/galactic/vrf",
		"--min-candidate-age", "1h")
	n.waitReady(log)
	// One pass: the stale tap is a candidate, kept with its rows for an hour.
	if rep := n.force(""); rep.Result != "completed" {
		t.Fatalf("a pass: %+v\n%s", rep, log)
	}

	// The API server as the node reaches it.
	u, err := url.Parse(cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	nettest.Forward(t, n.ns, "127.0.0.1:6443", u.Host)
	s.apiserver = "https://127.0.0.1:6443"

	// Two nodes' pods: the finder must pick node-a's. No kubelet runs
	// them; they need only exist.
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, obj := range []struct {
		create func() error
	}{
		{func() error {
			_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "galactic-system"}}, metav1.CreateOptions{})
			return err
		}},
		{func() error {
			_, err := cs.CoreV1().ServiceAccounts("galactic-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
			return err
		}},
	} {
		if err := obj.create(); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, nodeName := range []string{"node-a", "node-b"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "galactic-node-runbook-", Labels: map[string]string{"app.kubernetes.io/name": "galactic-node"}},
			Spec:       corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "galactic-node", Image: "ghcr.io/datum-cloud/galactic-node:runbook-test"}}},
		}
		created, err := cs.CoreV1().Pods("galactic-system").Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.CoreV1().Pods("galactic-system").Delete(context.Background(), created.Name, *metav1.NewDeleteOptions(0))
		})
		if nodeName == "node-a" {
			s.podA = created.Name
		}
	}
	return s
}

// onNode runs script on the node scene and fails t if it fails.
func (s *runbookScene) onNode(t *testing.T, env []string, block int, script string) {
	t.Helper()
	out, err := runIn(env, s.n.ns.Name, "mount --bind "+shellQuote(s.run)+" /run/galactic\n"+script)
	if err != nil {
		t.Errorf("block %d fails on the node: %v\n$ %s\n%s", block+1, err, script, out)
		return
	}
	t.Logf("block %d on the node:\n$ %s\n%s", block+1, script, out)
}

// runIn runs script with bash -euo pipefail, in netns ns and a private
// mount namespace when ns is set, from the repository's root.
func runIn(env []string, ns, script string) (string, error) {
	args := []string{"bash", "-euo", "pipefail", "-c", script}
	if ns != "" {
		args = append([]string{"ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private"}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir, cmd.Env = "..", env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
