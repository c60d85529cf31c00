package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

const (
	// nadExample is the NetworkAttachmentDefinition deploy/ ships as
	// galactic's network for Multus and KubeVirt.
	nadExample = "deploy/examples/multus/network-attachment-definition.yaml"
	// nadCRD is Multus' CRD for it, which Multus installs on a cluster.
	nadCRD = "integration/testdata/multus/network-attachment-definitions.crd.yaml"
	// multusSection is the docs/operations.md section that sets it up.
	multusSection = "Multus and KubeVirt"
)

// sectionBlocks returns the sh blocks of a section of docs/operations.md,
// dedented.
func sectionBlocks(t *testing.T, name string) []string {
	t.Helper()
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## "+name+"\n")
	if !ok {
		t.Fatalf("docs/operations.md has no %q section", name)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var blocks []string
	for _, m := range shBlock.FindAllStringSubmatch(section, -1) {
		var lines []string
		for _, l := range strings.Split(m[2], "\n") {
			lines = append(lines, strings.TrimPrefix(l, m[1]))
		}
		blocks = append(blocks, strings.Join(lines, "\n"))
	}
	return blocks
}

// multusCRD is Multus' NetworkAttachmentDefinition CRD, as a test applies
// it before any definition.
func multusCRD(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile("../" + nadCRD)
	if err != nil {
		t.Fatal(err)
	}
	// The file opens with a comment-only document, saying where it is from.
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	crd := &unstructured.Unstructured{}
	for len(crd.Object) == 0 {
		if err := dec.Decode(&crd.Object); err != nil {
			t.Fatalf("%s: %v", nadCRD, err)
		}
	}
	if crd.GetKind() != "CustomResourceDefinition" {
		t.Fatalf("%s holds a %s", nadCRD, crd.GetKind())
	}
	return crd
}

// applyMultusCRD applies Multus' CRD through a and waits until the API
// server serves definitions.
func applyMultusCRD(t *testing.T, a *applier) {
	t.Helper()
	if err := a.apply(multusCRD(t), false); err != nil {
		t.Fatalf("Multus' CRD: %v", err)
	}
	waitFor(t, "the API server to serve NetworkAttachmentDefinitions", func() bool {
		a.rm.Reset()
		_, err := a.rm.RESTMapping(schema.GroupKind{Group: "k8s.cni.cncf.io", Kind: "NetworkAttachmentDefinition"}, "v1")
		return err == nil
	})
}

// exampleNADConfig returns the spec.config of the NetworkAttachmentDefinition
// deploy/ ships, as written in the file.
func exampleNADConfig(t *testing.T) string {
	t.Helper()
	objs := manifestFiles(t)["../"+nadExample]
	if len(objs) != 1 || objs[0].GetKind() != "NetworkAttachmentDefinition" {
		t.Fatalf("%s holds %d objects, want one NetworkAttachmentDefinition", nadExample, len(objs))
	}
	config, ok, _ := unstructured.NestedString(objs[0].Object, "spec", "config")
	if !ok || config == "" {
		t.Fatalf("%s has no spec.config", nadExample)
	}
	return config
}

// multusDelegate reads a NetworkAttachmentDefinition's spec.config as
// Multus does: the definition's name goes in when the config has none
// (GetCNIConfigFromSpec), then a config with a type is one plugin and one
// without is a conflist (LoadDelegateNetConf), and libcni loads it.
func multusDelegate(t *testing.T, config, name string) *libcni.NetworkConfigList {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal([]byte(config), &raw); err != nil {
		t.Fatalf("spec.config is not JSON: %v\n%s", err, config)
	}
	if n, _ := raw["name"].(string); n == "" {
		raw["name"] = name
	}
	b, _ := json.Marshal(raw)
	if typ, _ := raw["type"].(string); typ != "" {
		conf, err := libcni.ConfFromBytes(b) //nolint:staticcheck // single-plugin .conf files are what containerd's go-cni and Multus still read
		if err != nil {
			t.Fatalf("spec.config as one plugin: %v", err)
		}
		list, err := libcni.ConfListFromConf(conf) //nolint:staticcheck // single-plugin .conf files are what containerd's go-cni and Multus still read
		if err != nil {
			t.Fatal(err)
		}
		return list
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatalf("spec.config as a conflist: %v", err)
	}
	return list
}

// withPluginFields returns list with fields set on its galactic-tap
// plugin, as a list libcni loads.
func withPluginFields(t *testing.T, list *libcni.NetworkConfigList, set map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal(list.Bytes, &raw); err != nil {
		t.Fatal(err)
	}
	plugins, _ := raw["plugins"].([]any)
	if len(plugins) == 0 {
		t.Fatal("the network has no plugins")
	}
	p := plugins[0].(map[string]any)
	for k, v := range set {
		p[k] = v
	}
	b, _ := json.Marshal(raw)
	out, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTheShippedNetworkAttachmentDefinitionRunsThePlugin applies Multus'
// CRD, galactic's namespace and then the docs' "Multus and KubeVirt"
// steps, as written, with a real kubectl against a real API server; reads
// the definition back with kubectl; reads its spec.config as Multus does;
// and runs ADD, CHECK and DEL of the built plugin with it through libcni,
// as Multus delegates to it, in real network namespaces.
func TestTheShippedNetworkAttachmentDefinitionRunsThePlugin(t *testing.T) {
	kubectl := kubectlBinary(t)
	c := clustertest.Start(t) // a cluster of its own: the CRD is applied here, not by envtest
	defer func() { _ = c.Env.Stop() }()
	env := append(os.Environ(), "KUBECONFIG="+writeKubeconfig(t, c.Config), "PATH="+filepath.Dir(kubectl)+":"+os.Getenv("PATH"))
	run := func(name string, args ...string) []byte {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = "..", env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return out
	}
	// What a cluster with Multus and galactic holds before the steps.
	run(kubectl, "apply", "-f", nadCRD)
	run(kubectl, "wait", "--for=condition=Established", "--timeout=60s", "crd/network-attachment-definitions.k8s.cni.cncf.io")
	run(kubectl, "apply", "-f", "deploy/base/namespace.yaml")

	steps := sectionBlocks(t, multusSection)
	if len(steps) == 0 {
		t.Fatalf("the %q section has no sh block", multusSection)
	}
	applied := false
	for i, step := range steps {
		out := run("bash", "-euo", "pipefail", "-c", step)
		t.Logf("step %d:\n$ %s\n%s", i+1, step, out)
		applied = applied || strings.Contains(step, "kubectl apply -f "+nadExample)
	}
	if !applied {
		t.Fatalf("no step of the %q section applies %s", multusSection, nadExample)
	}

	var nad struct {
		Metadata struct{ Name, Namespace string }
		Spec     struct{ Config string }
	}
	got := run(kubectl, "-n", "galactic-system", "get", "network-attachment-definitions.k8s.cni.cncf.io", "galactic", "-o", "json")
	if err := json.Unmarshal(got, &nad); err != nil {
		t.Fatalf("kubectl get: %v\n%s", err, got)
	}
	list := multusDelegate(t, nad.Spec.Config, nad.Metadata.Name)
	if list.Name != "galactic" || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "galactic-tap" {
		t.Fatalf("spec.config: network %q, %d plugins, want galactic with galactic-tap", list.Name, len(list.Plugins))
	}
	// One network, two ways to ship it: the definition, and the conflist
	// install-cni --multus-conf-dir installs for a definition with no
	// spec.config.
	shipped, err := os.ReadFile("../deploy/node/10-galactic.conflist")
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if json.Unmarshal([]byte(nad.Spec.Config), &a) != nil || json.Unmarshal(shipped, &b) != nil || !reflect.DeepEqual(a, b) {
		t.Errorf("spec.config and deploy/node/10-galactic.conflist differ:\n%s\n%s", nad.Spec.Config, shipped)
	}
	// The example names no host path: the plugin's defaults are the
	// DaemonSet's.
	var plugin map[string]any
	if err := json.Unmarshal(list.Plugins[0].Bytes, &plugin); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"bpffs", "vrfLockDir", "dataDir", "vpc", "vpcAttachment"} {
		if _, ok := plugin[k]; ok {
			t.Errorf("spec.config sets %s: the example takes the plugin's default, and each attachment brings its identity", k)
		}
	}

	// ADD, CHECK, DEL of the built plugin with that network, through
	// libcni as Multus delegates, on net1 (Multus' name for a pod's first
	// secondary interface). The test's own host paths stand in for the
	// node's and the bridge for the VRF this kernel lacks. The identity
	// comes both ways the docs give it: a pod's cni-args, which Multus
	// writes into every plugin's args.cni, and a KubeVirt VM's definition
	// of its own, with vpc and vpcAttachment in the plugin's entry.
	h := newCNIHost(t)
	r := newRuntime(t, h)
	testPaths := map[string]any{"bpffs": h.bpffs, "vrfLockDir": h.locks, "dataDir": h.dataDir, "master": "bridge"}
	for _, c := range []struct {
		how, att, container string
		net                 *libcni.NetworkConfigList
	}{
		{"a pod's cni-args", "n", ctrA, withCNIArgs(t, withPluginFields(t, list, testPaths),
			map[string]any{"GALACTIC_VPC": "a", "GALACTIC_VPC_ATTACHMENT": "n"})},
		{"a VM's own definition", "p", strings.Repeat("d", 64), withPluginFields(t, withPluginFields(t, list, testPaths),
			map[string]any{"vpc": "a", "vpcAttachment": "p", "routes": routesOf("p")})},
	} {
		rt := r.rt(c.container, "net1")
		if c.att == "n" {
			// The pod's network selection's "ips", which Multus passes
			// through the definition's "ips" capability.
			rt.CapabilityArgs = map[string]any{"ips": []string{"10.10.0.23/24"}}
		}
		if err := r.in(func(ctx context.Context) error { _, err := r.cni.AddNetworkList(ctx, c.net, rt); return err }); err != nil {
			t.Fatalf("%s: ADD with the definition's network: %v", c.how, err)
		}
		if l, ok := h.link(tapName(c.att)); !ok || l.Alias != c.container {
			t.Fatalf("%s: ADD made no tap %s stamped by the container", c.how, tapName(c.att))
		}
		if err := r.in(func(ctx context.Context) error { return r.cni.CheckNetworkList(ctx, c.net, rt) }); err != nil {
			t.Fatalf("%s: CHECK: %v", c.how, err)
		}
		if err := r.in(func(ctx context.Context) error { return r.cni.DelNetworkList(ctx, c.net, rt) }); err != nil {
			t.Fatalf("%s: DEL: %v", c.how, err)
		}
		if _, ok := h.link(tapName(c.att)); ok {
			t.Fatalf("%s: DEL left the tap", c.how)
		}
	}
}

// withCNIArgs returns list with args merged into every plugin's args.cni,
// as Multus writes a network selection's cni-args into a conflist
// (addCNIArgsInConfList, injectCNIArgs).
func withCNIArgs(t *testing.T, list *libcni.NetworkConfigList, args map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	var raw map[string]any
	if err := json.Unmarshal(list.Bytes, &raw); err != nil {
		t.Fatal(err)
	}
	plugins, _ := raw["plugins"].([]any)
	for _, p := range plugins {
		plugin := p.(map[string]any)
		a, _ := plugin["args"].(map[string]any)
		if a == nil {
			a = map[string]any{}
			plugin["args"] = a
		}
		cni, _ := a["cni"].(map[string]any)
		if cni == nil {
			cni = map[string]any{}
			a["cni"] = cni
		}
		for k, v := range args {
			cni[k] = v
		}
	}
	b, _ := json.Marshal(raw)
	out, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The multus-conf-dir component makes the DaemonSet's install-cni put the
// network's conflist into Multus' folder on the host, where Multus finds
// it for a definition named galactic with no spec.config, and nothing
// into the runtime's folder. The init container's arguments are run with
// the built binary, their /host paths under a stand-in root.
func TestTheMultusConfDirComponentPutsTheNetworkWhereMultusFindsIt(t *testing.T) {
	deployDir, err := filepath.Abs("../deploy")
	if err != nil {
		t.Fatal(err)
	}
	overlay := t.TempDir()
	// kustomize takes no absolute path to another kustomization.
	rel, err := filepath.Rel(overlay, deployDir)
	if err != nil {
		t.Fatal(err)
	}
	k := "resources: [" + rel + "]\ncomponents: [" + filepath.Join(rel, "components/multus-conf-dir") + "]\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	var spec *corev1.PodSpec
	for _, obj := range build(t, overlay) {
		if obj.GetKind() == "DaemonSet" && obj.GetName() == "galactic-node" {
			spec = podSpec(t, obj)
		}
	}
	if spec == nil || len(spec.InitContainers) != 1 {
		t.Fatal("the overlay has no galactic-node DaemonSet with its init container")
	}
	installer := spec.InitContainers[0]
	hostPathOf := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPathOf[v.Name] = v.HostPath.Path
		}
	}
	// Each mount of the init container, from its path in the container
	// to the host's folder.
	root := t.TempDir()
	mounts := map[string]string{}
	for _, m := range installer.VolumeMounts {
		if p, ok := hostPathOf[m.Name]; ok {
			mounts[m.MountPath] = filepath.Join(root, p)
		}
	}
	if mounts["/host/etc/cni/multus/net.d"] != filepath.Join(root, "/etc/cni/multus/net.d") {
		t.Fatalf("the init container mounts %v, want the host's /etc/cni/multus/net.d at /host/etc/cni/multus/net.d", mounts)
	}
	args := []string{"--plugin", tapPlugin, "--conflist", "../deploy/node/10-galactic.conflist", "--seccomp-profile=", "--seccomp-dir=", "--cli=", "--cli-dir=",
		"--cni-bin-dir", mounts["/host/opt/cni/bin"], "--cni-conf-dir", mounts["/host/etc/cni/net.d"]}
	if len(installer.Args) != 2 || installer.Args[0] != "install-cni" {
		t.Fatalf("init container args %v, want install-cni and the component's one flag", installer.Args)
	}
	for _, a := range installer.Args[1:] {
		name, value, ok := strings.Cut(a, "=")
		if !ok || mounts[value] == "" {
			t.Fatalf("init container argument %q is not a flag naming a mounted folder", a)
		}
		args = append(args, name+"="+mounts[value])
	}
	out, err := exec.Command(binary, append([]string{"install-cni"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("install-cni %v: %v\n%s", args, err, out)
	}
	if got := multusConfByName(t, mounts["/host/etc/cni/multus/net.d"], "galactic"); got.Type != "galactic-tap" {
		t.Fatalf("Multus finds %s in its folder, want galactic's network", got)
	}
	if got := tree(t, mounts["/host/etc/cni/net.d"]); len(got) != 0 {
		t.Fatalf("install-cni wrote into the runtime's folder: %v", treeNames(got))
	}
}
