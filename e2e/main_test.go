package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The test's own image: the sandbox ("pause") image of every pod, and the
// workload of the ordinary pods (testdata/pod).
const podImage = "galactic.test/e2e-pod:1"

// runtimeKind is a container runtime a node runs: containerd from dir
// under hack/e2ebin.sh's folder (its top when empty), configured in the
// config file format configVersion.
type runtimeKind struct {
	name          string
	dir           string
	configVersion int
	// fromRelease installs galactic as docs/operations.md's "Install from
	// a release" says, from a release `make release` makes of HEAD,
	// rather than from deploy/.
	fromRelease bool
}

// startTestNode starts a node on rt for t, stopped when t ends. Without
// root, the binaries or the images it skips, saying how to get them, except
// under CI=true, where it fails.
func startTestNode(t *testing.T, rt runtimeKind) *node {
	t.Helper()
	bins, testbin := os.Getenv("GALACTICTEST_E2EBIN"), os.Getenv("KUBEBUILDER_ASSETS")
	var missing string
	switch {
	case os.Geteuid() != 0:
		missing = "root"
	case bins == "" || testbin == "":
		missing = "GALACTICTEST_E2EBIN=$(hack/e2ebin.sh) and KUBEBUILDER_ASSETS=$(hack/testbin.sh)"
	case !exists(filepath.Join(repoRoot(), "bin", "galactic-node.oci.tar")):
		missing = "the images (make images)"
	}
	if missing != "" {
		msg := "the e2e node needs " + missing + ": run `make e2e`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	n, err := startNode(ctx, t.Logf, bins, testbin, rt)
	if n != nil {
		t.Cleanup(func() {
			if t.Failed() {
				for _, name := range []string{"kubelet", "containerd", "kube-apiserver"} {
					t.Logf("%s's log ends:\n%s", name, n.logTail(name, 40))
				}
			}
			n.stop(t.Logf)
		})
	}
	if err == nil {
		err = n.loadImages()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node on %s: ready with its images in %s", rt.name, time.Since(start).Round(time.Second))
	return n
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Dir(wd)
}

// loadImages imports into containerd the images `make images` wrote, under
// the digests deploy/base pins, and the test's pod image.
func (n *node) loadImages() error {
	if err := n.buildPodImage(); err != nil {
		return err
	}
	for _, name := range []string{"galactic-node", "galactic-hubctl"} {
		b, err := os.ReadFile(filepath.Join(repoRoot(), "bin", name+".digest"))
		if err != nil {
			return fmt.Errorf("the digest of %s: %w", name, err)
		}
		if err := n.importImage(filepath.Join(repoRoot(), "bin", name+".oci.tar"), "ghcr.io/datum-cloud/"+name, strings.TrimSpace(string(b))); err != nil {
			return err
		}
	}
	return n.importImage(filepath.Join(n.dir, "pod.oci.tar"), strings.TrimSuffix(podImage, ":1"), "")
}

// importImage imports an OCI archive and names its image repo@digest too,
// the name a digest-pinned pod asks the runtime for.
func (n *node) importImage(archive, repo, digest string) error {
	args := []string{"images", "import"}
	if n.runtime.configVersion >= 3 {
		args = append(args, "--local") // 2.x: without the transfer service
	}
	out, err := n.ctr(append(args, archive)...)
	if err != nil {
		return err
	}
	if digest == "" {
		return nil
	}
	// REF TYPE DIGEST ...: the tag whose manifest is this archive's, not
	// another build's of the same repository.
	list, err := n.ctr("images", "list")
	if err != nil {
		return err
	}
	var tagged string
	for line := range strings.SplitSeq(list, "\n") {
		if f := strings.Fields(line); len(f) > 2 && strings.HasPrefix(f[0], repo+":") && f[2] == digest {
			tagged = f[0]
		}
	}
	if tagged == "" {
		return fmt.Errorf("import %s: no %s image of digest %s after it: %s", archive, repo, digest, out)
	}
	_, err = n.ctr("images", "tag", "--force", tagged, repo+"@"+digest)
	return err
}

func (n *node) buildPodImage() error {
	bin := filepath.Join(n.dir, "pod")
	build := exec.Command("go", "build", "-o", bin, "./e2e/testdata/pod")
	build.Dir, build.Env = repoRoot(), append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build the pod program: %w: %s", err, out)
	}
	image := exec.Command("go", "run", "./hack/imagebuild", "-ref", podImage, "-add", bin+"=/pod",
		"-entrypoint", "/pod", "-epoch", "1700000000", "-out", filepath.Join(n.dir, "pod.oci.tar"),
		"-digest-file", filepath.Join(n.dir, "pod.digest"))
	image.Dir = repoRoot()
	if out, err := image.CombinedOutput(); err != nil {
		return fmt.Errorf("build the pod image: %w: %s", err, out)
	}
	return nil
}

// kubectl runs the testbin's kubectl as cluster-admin from inside the
// node's network namespace, in the repository's folder.
func (n *node) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := n.kubectlErr(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (n *node) kubectlErr(args ...string) (string, error) {
	return n.shell("kubectl " + shellQuote(args))
}

// shell runs a bash script as an operator at a shell with kubectl would:
// in the node's network namespace, in the repository's folder.
func (n *node) shell(script string) (string, error) {
	return n.shellIn(repoRoot(), nil, script)
}

// shellIn is shell in another folder, with more of the environment.
func (n *node) shellIn(dir string, env []string, script string) (string, error) {
	cmd := exec.Command("nsenter", "--net=/run/netns/"+n.netns, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+n.admin, "PATH="+n.testbin+":"+os.Getenv("PATH")), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("$ %s: %w\n%s", script, err, out.String())
	}
	return out.String(), nil
}

func shellQuote(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// waitPod waits until the pod is Running and Ready.
func (n *node) waitPod(t *testing.T, namespace, name string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	var pod *corev1.Pod
	err := n.waitFor(ctx, "pod "+namespace+"/"+name+" Ready", timeout, func() (bool, error) {
		var err error
		pod, err = n.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // not there yet: poll again
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		n.describe(t, namespace, name)
		t.Fatal(err)
	}
	return pod
}

// describe logs what an operator would look at for a pod that is not
// what it should be.
func (n *node) describe(t *testing.T, namespace, name string) {
	t.Helper()
	out, _ := n.kubectlErr("-n", namespace, "describe", "pod", name)
	t.Logf("kubectl describe pod %s/%s:\n%s", namespace, name, out)
	t.Logf("kubelet's log ends:\n%s", n.logTail("kubelet", 30))
	t.Logf("containerd's log ends:\n%s", n.logTail("containerd", 30))
}
