package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/datum-cloud/galactic-node/admin"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/opsdoc"
)

// ownedCRDGroups are the API groups whose CRDs this project owns. None yet:
// every CRD it reads or writes belongs to another system (the fabric, the
// address service, the network API), and nodes.galactic.datum.net is only
// a SubjectAccessReview resource, never stored.
var ownedCRDGroups = map[string]bool{}

// A shared cluster's other systems own their CRDs: applying the default
// install must not overwrite their schemas, nor deleting it delete every
// object of them. Labs get them from deploy/dev.
func TestTheDefaultInstallHoldsNoOtherSystemsCRD(t *testing.T) {
	for _, dir := range kustomizations {
		for _, obj := range build(t, dir) {
			if obj.GetKind() != "CustomResourceDefinition" {
				continue
			}
			group, _, _ := unstructured.NestedString(obj.Object, "spec", "group")
			if !ownedCRDGroups[group] {
				t.Errorf("%s installs CRD %s of group %s, which this project does not own", dir, obj.GetName(), group)
			}
		}
	}
	crds := 0
	for _, obj := range build(t, devKustomization) {
		if obj.GetKind() == "CustomResourceDefinition" {
			crds++
		}
	}
	if crds < 6 {
		t.Errorf("%s carries %d CRDs; labs need the six of the systems galactic works with", devKustomization, crds)
	}
}

// The namespace is applied before anything that lives in it, and carries
// the Pod Security level its pods need.
func TestTheNamespaceComesFirstWithItsPodSecurityLevel(t *testing.T) {
	for _, dir := range append(kustomizations, devKustomization) {
		seen := false
		for _, obj := range build(t, dir) {
			if obj.GetKind() == "Namespace" && obj.GetName() == "galactic-system" {
				seen = true
				if got := obj.GetLabels()["pod-security.kubernetes.io/enforce"]; got != "privileged" {
					t.Errorf("%s: namespace enforces Pod Security level %q, want privileged", dir, got)
				}
				continue
			}
			if obj.GetNamespace() == "galactic-system" && !seen {
				t.Errorf("%s: %s %s comes before its namespace", dir, obj.GetKind(), obj.GetName())
			}
		}
		if !seen {
			t.Errorf("%s has no galactic-system Namespace", dir)
		}
	}
}

// pinnedImage is an image of this project named by digest, never by tag.
var pinnedImage = regexp.MustCompile(`^ghcr\.io/datum-cloud/galactic-(node|hubctl)@sha256:[0-9a-f]{64}$`)

func TestEveryImageIsPinnedByDigest(t *testing.T) {
	for _, dir := range append(kustomizations, devKustomization) {
		for _, obj := range build(t, dir) {
			spec := podSpec(t, obj)
			if spec == nil {
				continue
			}
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				if !pinnedImage.MatchString(c.Image) || strings.HasSuffix(c.Image, strings.Repeat("0", 64)) {
					t.Errorf("%s: %s %s container %s: image %q is not pinned by a real digest (make images pin-images)", dir, obj.GetKind(), obj.GetName(), c.Name, c.Image)
				}
			}
		}
	}
}

// podSpec returns the pod spec of a workload object, or nil.
func podSpec(t *testing.T, obj *unstructured.Unstructured) *corev1.PodSpec {
	t.Helper()
	switch obj.GetKind() {
	case "DaemonSet", "Deployment":
	default:
		return nil
	}
	raw, _, _ := unstructured.NestedMap(obj.Object, "spec", "template")
	var tmpl corev1.PodTemplateSpec
	if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(raw, &tmpl); err != nil {
		t.Fatalf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
	}
	return &tmpl.Spec
}

// workload returns the named workload of the default build.
func workload(t *testing.T, kind, name string) (*unstructured.Unstructured, *corev1.PodTemplateSpec) {
	t.Helper()
	for _, obj := range build(t, "../deploy") {
		if obj.GetKind() == kind && obj.GetName() == name {
			raw, _, _ := unstructured.NestedMap(obj.Object, "spec", "template")
			var tmpl corev1.PodTemplateSpec
			if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(raw, &tmpl); err != nil {
				t.Fatal(err)
			}
			return obj, &tmpl
		}
	}
	t.Fatalf("the default build has no %s %s", kind, name)
	return nil, nil
}

// flagValue returns the value of --name in args, or def.
func flagValue(args []string, name, def string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			def = v
		}
	}
	return def
}

// defaultOf reads a flag's default from the built daemon's own help, so
// the test follows the binary.
func defaultOf(t *testing.T, name string) string {
	t.Helper()
	out, _ := exec.Command(binary, "run", "-h").CombinedOutput()
	m := regexp.MustCompile(`(?m)^\s+-` + regexp.QuoteMeta(name) + ` \S+\n(?:\s{4,}.*\n)*?\s{4,}.*\(default ([^)]+)\)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("galactic-node run -h names no default for -%s:\n%s", name, out)
	}
	return string(m[1])
}

func TestTheNodeDaemonSetIsHardenedAndProbed(t *testing.T) {
	_, tmpl := workload(t, "DaemonSet", "galactic-node")
	spec := tmpl.Spec
	if sc := spec.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile %+v, want RuntimeDefault", spec.SecurityContext)
	}
	c := spec.Containers[0]
	// The daemon's own profile: RuntimeDefault's refusals but bpf(2).
	if sc := c.SecurityContext; sc == nil || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeLocalhost ||
		sc.SeccompProfile.LocalhostProfile == nil || *sc.SeccompProfile.LocalhostProfile != "galactic/galactic-node.json" {
		t.Errorf("daemon container seccompProfile %+v, want Localhost galactic/galactic-node.json", c.SecurityContext)
	}
	raw, err := os.ReadFile("../deploy/node/seccomp/galactic-node.json")
	if err != nil {
		t.Fatal(err)
	}
	var profile struct {
		DefaultAction string
		Syscalls      []struct {
			Names  []string
			Action string
		}
	}
	if err := json.Unmarshal(raw, &profile); err != nil {
		t.Fatal(err)
	}
	// An allowlist: what no rule allows is refused, so a syscall the
	// kernel adds later is refused too.
	if profile.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Errorf("profile defaultAction %q, want SCMP_ACT_ERRNO (an allowlist)", profile.DefaultAction)
	}
	allowed := map[string]bool{}
	for _, r := range profile.Syscalls {
		for _, n := range r.Names {
			allowed[n] = allowed[n] || r.Action == "SCMP_ACT_ALLOW"
		}
	}
	if !allowed["bpf"] {
		t.Error("the daemon's seccomp profile refuses bpf(2)")
	}
	for _, n := range []string{"mount", "umount2", "unshare", "setns", "ptrace", "kexec_load", "init_module", "finit_module", "keyctl", "perf_event_open",
		"io_uring_setup", "open_by_handle_at", "vmsplice", "modify_ldt", "userfaultfd", "add_key", "pivot_root", "chroot"} {
		if allowed[n] {
			t.Errorf("the daemon's seccomp profile allows %s, which RuntimeDefault refuses or the daemon never calls", n)
		}
	}
	shutdown, err := time.ParseDuration(flagValue(c.Args, "shutdown-timeout", defaultOf(t, "shutdown-timeout")))
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet kills at the grace period: the daemon's own deadline
	// must run out first, with room for the process to exit.
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < shutdown+10*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v does not cover --shutdown-timeout %s plus 10 s", g, shutdown)
	}
	ports := map[string]bool{}
	for _, p := range c.Ports {
		ports[p.Name] = true
	}
	for what, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"startup": {c.StartupProbe, "/healthz"}, "liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
		if want.p == nil || want.p.HTTPGet == nil {
			t.Errorf("no %s probe", what)
			continue
		}
		if want.p.HTTPGet.Path != want.path || !ports[want.p.HTTPGet.Port.StrVal] {
			t.Errorf("%s probe GET %s on port %q, want %s on a named port of the container", what, want.p.HTTPGet.Path, want.p.HTTPGet.Port.String(), want.path)
		}
	}
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container %s: want a read-only root and no privilege escalation", c.Name)
		}
		if sc != nil && sc.Capabilities != nil {
			if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
				t.Errorf("container %s drops %v, want ALL", c.Name, sc.Capabilities.Drop)
			}
			for _, add := range sc.Capabilities.Add {
				if add != "NET_ADMIN" && add != "BPF" {
					t.Errorf("container %s adds %s: only NET_ADMIN and BPF are needed", c.Name, add)
				}
			}
		}
	}
	if len(spec.InitContainers) != 1 || len(spec.InitContainers[0].Command) != 0 || strings.Join(spec.InitContainers[0].Args, " ") != "install-cni" {
		t.Errorf("the init container must run the image's `install-cni`, with no shell: %+v", spec.InitContainers)
	}
}

func TestTheHubDeploymentKeepsAReplicaThroughDrains(t *testing.T) {
	dep, tmpl := workload(t, "Deployment", "galactic-hubctl")
	replicas, _, _ := unstructured.NestedInt64(dep.Object, "spec", "replicas")
	var pdb *unstructured.Unstructured
	for _, obj := range build(t, "../deploy") {
		if obj.GetKind() == "PodDisruptionBudget" {
			sel, _, _ := unstructured.NestedStringMap(obj.Object, "spec", "selector", "matchLabels")
			match := len(sel) > 0
			for k, v := range sel {
				match = match && tmpl.Labels[k] == v
			}
			if match {
				pdb = obj
			}
		}
	}
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget selects the hub's pods")
	}
	maxUnavailable, hasMax, _ := unstructured.NestedInt64(pdb.Object, "spec", "maxUnavailable")
	minAvailable, hasMin, _ := unstructured.NestedInt64(pdb.Object, "spec", "minAvailable")
	keepsOne := (hasMax && maxUnavailable < replicas) || (hasMin && minAvailable >= 1)
	if !keepsOne {
		t.Errorf("PodDisruptionBudget %s lets a drain take all %d replicas", pdb.GetName(), replicas)
	}
}

// Pod Security admission admits the pods the install makes in their
// namespace, and the level is what admits them: the node's pod is refused
// at baseline. The hub's pod passes restricted.
func TestPodSecurityAdmitsThePodsAtTheNamespacesLevel(t *testing.T) {
	a := newApplier(t)
	cs, err := kubernetes.NewForConfig(a.c.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range build(t, "../deploy") {
		if obj.GetKind() == "Namespace" {
			if err := a.apply(obj, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, level := range []string{"baseline", "restricted"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "psa-" + level, Labels: map[string]string{"pod-security.kubernetes.io/enforce": level}}}
		if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	dryRun := func(tmpl *corev1.PodTemplateSpec, ns string) error {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "psa-", Labels: tmpl.Labels}, Spec: tmpl.Spec}
		_, err := cs.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	_, node := workload(t, "DaemonSet", "galactic-node")
	_, hub := workload(t, "Deployment", "galactic-hubctl")
	for _, c := range []struct {
		what  string
		tmpl  *corev1.PodTemplateSpec
		ns    string
		admit bool
	}{
		{"node pod in galactic-system", node, "galactic-system", true},
		{"hub pod in galactic-system", hub, "galactic-system", true},
		{"node pod at baseline", node, "psa-baseline", false},
		{"hub pod at restricted", hub, "psa-restricted", true},
	} {
		err := dryRun(c.tmpl, c.ns)
		if c.admit && err != nil {
			t.Errorf("%s refused: %v", c.what, err)
		}
		if !c.admit && (err == nil || !apierrors.IsForbidden(err)) {
			t.Errorf("%s: %v, want Pod Security to refuse it", c.what, err)
		}
	}
}

// installSteps returns the sh blocks of docs/operations.md's Install
// section, in order.
func installSteps(t *testing.T) []string {
	t.Helper()
	steps, err := opsdoc.InstallSteps("..")
	if err != nil {
		t.Fatal(err)
	}
	return steps
}

// kubectlBinary is the kubectl hack/testbin.sh builds beside the API
// server. Missing, it fails the test under CI=true and skips it elsewhere.
func kubectlBinary(t *testing.T) string {
	t.Helper()
	kubectl := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		msg := "needs kubectl beside the API server: run `make test`, or KUBEBUILDER_ASSETS=$(hack/testbin.sh) go test ..."
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return kubectl
}

// The install steps run as written, in order, with a real kubectl against
// a real API server where only the platform's own preconditions hold: its
// namespace, and the CRDs of the systems galactic works with.
func TestTheInstallStepsRunInOrderAsWritten(t *testing.T) {
	kubectl := kubectlBinary(t)
	c := clustertest.Start(t) // a cluster of its own: no namespace made by another test
	defer func() { _ = c.Env.Stop() }()
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "platform"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	steps := installSteps(t)
	env := append(os.Environ(), "KUBECONFIG="+writeKubeconfig(t, c.Config), "PATH="+filepath.Dir(kubectl)+":"+os.Getenv("PATH"))
	for i, step := range steps {
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", step)
		cmd.Dir, cmd.Env = "..", env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("install step %d failed: %v\n$ %s\n%s", i+1, err, step, out)
		}
		t.Logf("step %d:\n$ %s\n%s", i+1, step, out)
	}

	ctx := context.Background()
	ns, err := cs.CoreV1().Namespaces().Get(ctx, "galactic-system", metav1.GetOptions{})
	if err != nil || ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Fatalf("namespace after install: %v %v", ns.Labels, err)
	}
	ds, err := cs.AppsV1().DaemonSets("galactic-system").Get(ctx, "galactic-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(ds.Spec.Template.Spec.Containers[0].Args, " "), "--dry-run") {
		t.Errorf("the first rollout is not in dry-run: %v", ds.Spec.Template.Spec.Containers[0].Args)
	}
	if _, err := cs.AppsV1().Deployments("galactic-system").Get(ctx, "galactic-hubctl", metav1.GetOptions{}); err != nil {
		t.Error(err)
	}
	// The tokens the docs make are ones the daemon accepts.
	sec, err := cs.CoreV1().Secrets("galactic-system").Get(ctx, "galactic-node-admin-tokens", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, sec.Data["tokens"], 0o400); err != nil {
		t.Fatal(err)
	}
	tokens, err := admin.LoadTokenFile(path)
	if err != nil {
		t.Fatalf("the docs' token Secret: %v", err)
	}
	if tokens.Count() != 2 {
		t.Fatalf("the docs' token Secret holds %d tokens, want read and admin", tokens.Count())
	}
}

// The kubelet gives a pod's containers variables for every Service of its
// namespace unless the pod says not to; the project's own Services are
// named galactic-…, so their variables would read as GALACTIC_* flags.
func TestThePodsAskForNoServiceLinks(t *testing.T) {
	for _, w := range []struct{ kind, name string }{{"DaemonSet", "galactic-node"}, {"Deployment", "galactic-hubctl"}} {
		_, tmpl := workload(t, w.kind, w.name)
		if l := tmpl.Spec.EnableServiceLinks; l == nil || *l {
			t.Errorf("%s %s: enableServiceLinks is not false", w.kind, w.name)
		}
	}
}

// The digests deploy/base pins are the images this tree builds: `make
// images` names an image by the last commit that changed its sources, so a
// commit that only pins (make images pin-images) builds the same images it
// names. Reads what `make images` wrote into bin/, as make test runs it
// first. A tree whose image sources have uncommitted changes builds
// -dirty images no pin can name: outside CI that is said and skipped.
func TestThePinnedDigestsAreWhatThisTreeBuilds(t *testing.T) {
	// make test-unit (-short) runs on a fresh clone, where no image is built.
	if testing.Short() {
		t.Skip("reads the digests `make images` writes, which make test builds first and make test-unit does not")
	}
	// The Makefile's IMAGE_SOURCES.
	sources := []string{"go.mod", "go.sum", "Makefile", "LICENSE", "cmd", "node", "ebpf", "admin", "hubctl", "internal", "hack/imagebuild",
		"hack/sbom", "deploy/node/seccomp", ":(exclude,glob)**/*_test.go", ":(exclude,glob)**/testdata/**"}
	// A shallow clone has no history to find the images' commit in: it
	// builds images named by the wrong one.
	if out, _ := exec.Command("git", "-C", "..", "rev-parse", "--is-shallow-repository").Output(); strings.TrimSpace(string(out)) == "true" {
		t.Skip("a shallow clone cannot name the last commit that changed the image sources")
	}
	if err := exec.Command("git", append([]string{"-C", "..", "diff", "--quiet", "HEAD", "--"}, sources...)...).Run(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the image sources differ from HEAD under CI (git diff: %v): the pinned digests cannot be checked", err)
		}
		t.Skip("the image sources have uncommitted changes: the images are -dirty, and no pin names them")
	}
	b, err := os.ReadFile("../deploy/base/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range []string{"galactic-node", "galactic-hubctl"} {
		built, err := os.ReadFile("../bin/" + img + ".digest")
		if err != nil {
			t.Fatalf("%v: run make images (make test does)", err)
		}
		m := regexp.MustCompile(`name: ghcr\.io/datum-cloud/` + img + `\n\s+digest: (sha256:[0-9a-f]{64})`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("deploy/base pins no digest for %s", img)
		}
		if got, want := string(m[1]), strings.TrimSpace(string(built)); got != want {
			t.Errorf("deploy/base pins %s@%s, but this tree builds %s: make images pin-images, and commit the pin", img, got, want)
		}
	}
}
