package layout

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/datum-cloud/galactic-node"

// pkg is what go list says of one package.
type pkg struct {
	ImportPath string
	Imports    []string
}

// deps lists root and every package it imports, transitively, test files
// excluded: what the built binary links. With -test among flags, it lists
// root's test binary too, as root+".test", and the packages' test variants
// by the names go list gives them ("p [root.test]").
func deps(t *testing.T, root string, flags ...string) map[string]pkg {
	t.Helper()
	args := append([]string{"list", "-deps", "-json=ImportPath,Imports"}, flags...)
	cmd := exec.Command("go", append(args, root)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", root, err, stderr.String())
	}
	all := map[string]pkg{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list -deps %s: decode: %v", root, err)
		}
		all[p.ImportPath] = p
	}
	if _, ok := all[root]; !ok {
		t.Fatalf("go list -deps %s does not list %s", root, root)
	}
	return all
}

// chains returns, for each package of all that bad matches, one shortest
// chain of imports from root to it, so that a failure names the import to
// cut rather than only the package that came in.
func chains(root string, all map[string]pkg, bad func(string) bool) []string {
	from := map[string]string{root: ""}
	queue := []string{root}
	var found []string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if bad(p) {
			var chain []string
			for q := p; q != ""; q = from[q] {
				chain = append(chain, q)
			}
			slices.Reverse(chain)
			found = append(found, strings.Join(chain, " -> "))
			continue // what a bad package imports is its own business
		}
		for _, imp := range all[p].Imports {
			if _, seen := from[imp]; !seen {
				from[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	slices.Sort(found)
	return found
}

func kubernetesOrPrometheus(path string) bool {
	return strings.HasPrefix(path, "k8s.io/") || strings.HasPrefix(path, "sigs.k8s.io/") ||
		strings.HasPrefix(path, "github.com/prometheus/")
}

// The reclaim, the link layer and the teardown decide what is removed from
// a node; the CNI plugin runs once per ADD and DEL. None may link client-go
// or a Prometheus client: the cluster inventory (node/inventory/kubeinventory)
// and the metrics (node/reclaim/reclaimmetrics, internal/buildinfo/buildmetric)
// are wired in by the daemon, and the core sees only interfaces.
func TestTheCoreAndThePluginLinkNoKubernetesAndNoPrometheus(t *testing.T) {
	for _, root := range []string{
		module + "/node/reclaim",
		module + "/node/link",
		module + "/node/teardown",
		module + "/cmd/galactic-tap",
	} {
		if bad := chains(root, deps(t, root), kubernetesOrPrometheus); len(bad) > 0 {
			t.Errorf("%s links Kubernetes or Prometheus packages, first reached through:\n\t%s", root, strings.Join(bad, "\n\t"))
		}
	}
}

// make fuzz builds the admin API's whole test binary with coverage
// instrumentation, every package it links included. Delegated
// authentication, which needs client-go, is its own package (admin/kubeauth)
// that the daemon wires in, so that neither admin nor its tests link
// Kubernetes: when they did, the fuzz build compiled 455 Kubernetes
// packages a fourth time, minutes of a cold make test.
func TestTheAdminAPIAndItsTestsLinkNoKubernetes(t *testing.T) {
	root := module + "/admin"
	isKubernetes := func(p string) bool {
		return strings.HasPrefix(p, "k8s.io/") || strings.HasPrefix(p, "sigs.k8s.io/")
	}
	if bad := chains(root+".test", deps(t, root, "-test"), isKubernetes); len(bad) > 0 {
		t.Errorf("%s's test binary links Kubernetes packages, first reached through:\n\t%s", root, strings.Join(bad, "\n\t"))
	}
}

// The eBPF datapath is the kernel side, below the node: the node's packages
// translate their types into its rows (node/attachreg), never the reverse.
func TestTheDatapathImportsNothingOfTheNode(t *testing.T) {
	cmd := exec.Command("go", "list", module+"/ebpf/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ebpf/...: %v", err)
	}
	roots := strings.Fields(string(out))
	if len(roots) == 0 {
		t.Fatal("go list ebpf/... lists no package")
	}
	for _, root := range roots {
		if bad := chains(root, deps(t, root), func(p string) bool { return strings.HasPrefix(p, module+"/node/") }); len(bad) > 0 {
			t.Errorf("%s imports the node's packages, through:\n\t%s", root, strings.Join(bad, "\n\t"))
		}
	}
}

// test/ holds what only tests the product: harnesses that start API
// servers, open taps and kill processes. The product's packages (their
// non-test files) must never reach it, so that nothing of it can ship.
func TestNoProductPackageImportsTheTestTree(t *testing.T) {
	out, err := exec.Command("go", "list", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	isTest := func(p string) bool { return strings.HasPrefix(p, module+"/test/") }
	var roots []string
	for _, p := range strings.Fields(string(out)) {
		if !isTest(p) && !strings.HasPrefix(p, module+"/integration") && !strings.HasPrefix(p, module+"/e2e") && !strings.HasPrefix(p, module+"/bench") {
			roots = append(roots, p)
		}
	}
	if len(roots) == 0 {
		t.Fatal("go list ./... lists no product package")
	}
	for _, root := range roots {
		if bad := chains(root, deps(t, root), isTest); len(bad) > 0 {
			t.Errorf("%s imports the test tree, through:\n\t%s", root, strings.Join(bad, "\n\t"))
		}
	}
}

// The broken rules the suites must catch (node/reclaim/reclaimbreak) are
// linked by the daemon's galactic_testhooks build only: a product binary
// that linked them could be one flag away from deleting held taps.
func TestNoProductBinaryLinksTheBrokenRules(t *testing.T) {
	for _, root := range []string{module + "/cmd/galactic-node", module + "/cmd/galactic-tap", module + "/cmd/galactic-hubctl"} {
		isBreak := func(p string) bool { return p == module+"/node/reclaim/reclaimbreak" }
		if bad := chains(root, deps(t, root), isBreak); len(bad) > 0 {
			t.Errorf("%s links the broken rules, through:\n\t%s", root, strings.Join(bad, "\n\t"))
		}
	}
}
