package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

// kustomizations are every kustomization a user may apply on a shared
// cluster; devKustomization adds other systems' CRDs, for labs and tests.
var kustomizations = []string{"../deploy", "../deploy/overlays/dry-run-rollout", "../deploy/overlays/delegated-auth"}

const devKustomization = "../deploy/dev"

func build(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		data, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(data); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

// manifestFiles decodes every Kubernetes object in every YAML file under
// deploy/ (kustomize's own files and the rule file are not objects).
func manifestFiles(t *testing.T) map[string][]*unstructured.Unstructured {
	t.Helper()
	out := map[string][]*unstructured.Unstructured{}
	err := filepath.WalkDir("../deploy", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") || filepath.Base(path) == "kustomization.yaml" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return err
			}
			var head struct{ APIVersion, Kind string }
			if err := json.Unmarshal(raw, &head); err != nil || head.APIVersion == "" || head.Kind == "" {
				continue // not an object: the alert rules file
			}
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(raw); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			out[path] = append(out[path], u)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

type applier struct {
	t  *testing.T
	c  *clustertest.Cluster
	rm *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(t *testing.T) *applier {
	c := clustertest.Shared(t)
	dc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	a := &applier{t: t, c: c, rm: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
	cs, _ := kubernetes.NewForConfig(c.Config)
	for _, ns := range []string{"galactic-system", "platform"} {
		_, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	return a
}

// apply server-side-applies obj; dryRun asks the API server to validate and
// admit it without storing it.
func (a *applier) apply(obj *unstructured.Unstructured, dryRun bool) error {
	gvk := obj.GroupVersionKind()
	m, err := a.rm.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: "galactic-deploy-test", Force: boolPtr(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	ri := a.c.Client.Resource(m.Resource)
	if m.Scope.Name() == "namespace" {
		_, err = ri.Namespace(obj.GetNamespace()).Patch(context.Background(), obj.GetName(), types.ApplyPatchType, data, opts)
	} else {
		_, err = ri.Patch(context.Background(), obj.GetName(), types.ApplyPatchType, data, opts)
	}
	return err
}

func boolPtr(b bool) *bool { return &b }

// TestEveryManifestIsAcceptedByTheAPIServer applies the CRDs for real, then
// every object of every kustomization and of every manifest file under
// deploy/ with a server-side dry run, and fails on any rejection.
func TestEveryManifestIsAcceptedByTheAPIServer(t *testing.T) {
	a := newApplier(t)
	for _, obj := range build(t, devKustomization) {
		if obj.GetKind() == "CustomResourceDefinition" {
			if err := a.apply(obj, false); err != nil {
				t.Fatalf("CRD %s: %v", obj.GetName(), err)
			}
		}
	}
	// Multus owns the CRD of the NetworkAttachmentDefinition example.
	applyMultusCRD(t, a)
	for _, dir := range append(kustomizations, devKustomization) {
		objs := build(t, dir)
		if len(objs) < 15 {
			t.Fatalf("%s built only %d objects", dir, len(objs))
		}
		for _, obj := range objs {
			if err := a.apply(obj, true); err != nil {
				t.Errorf("%s: %s %s/%s refused: %v", dir, obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
			}
		}
	}
	for path, objs := range manifestFiles(t) {
		for _, obj := range objs {
			if err := a.apply(obj, true); err != nil {
				t.Errorf("%s: %s %s refused: %v", path, obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	for _, dir := range kustomizations[1:] {
		for _, obj := range build(t, dir) {
			if obj.GetKind() != "DaemonSet" {
				continue
			}
			args, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
			flat, _ := json.Marshal(args)
			want := map[string]string{"../deploy/overlays/dry-run-rollout": "--dry-run", "../deploy/overlays/delegated-auth": "--admin-kube-auth"}[dir]
			if !strings.Contains(string(flat), want) {
				t.Errorf("%s: the DaemonSet lacks %s", dir, want)
			}
		}
	}
}

// TestEachServiceAccountHasExactlyWhatItNeeds applies the RBAC for real and
// asks the API server, through SubjectAccessReviews, what each component's
// service account may do.
func TestEachServiceAccountHasExactlyWhatItNeeds(t *testing.T) {
	a := newApplier(t)
	for _, obj := range build(t, "../deploy/overlays/delegated-auth") {
		switch obj.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Namespace":
			if err := a.apply(obj, false); err != nil {
				t.Fatalf("%s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	cs, _ := kubernetes.NewForConfig(a.c.Config)
	mayNamed := func(sa, verb, group, resource, ns, name string) bool {
		t.Helper()
		sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
			User:               "system:serviceaccount:galactic-system:" + sa,
			Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:galactic-system", "system:authenticated"},
			ResourceAttributes: &authzv1.ResourceAttributes{Verb: verb, Group: group, Resource: resource, Namespace: ns, Name: name},
		}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return sar.Status.Allowed
	}
	may := func(sa, verb, group, resource, ns string) bool {
		t.Helper()
		return mayNamed(sa, verb, group, resource, ns, "")
	}
	for _, c := range []struct {
		sa, verb, group, resource, ns string
		want                          bool
	}{
		{"galactic-node", "list", "cloud.datumapis.com", "vpcattachments", "", true},
		{"galactic-node", "watch", "network.datumapis.com", "bgpadvertisements", "", true},
		{"galactic-node", "get", "cloud.datumapis.com", "vpcattachments", "tenant", false},
		{"galactic-node", "delete", "cloud.datumapis.com", "vpcattachments", "tenant", false},
		{"galactic-node", "create", "network.datumapis.com", "bgpadvertisements", "tenant", false},
		{"galactic-node", "delete", "ipam.miloapis.com", "ipclaims", "platform", false},
		{"galactic-node", "list", "", "secrets", "", false},
		{"galactic-node", "create", "authentication.k8s.io", "tokenreviews", "", true}, // delegated auth only
		{"galactic-node", "create", "authorization.k8s.io", "subjectaccessreviews", "", true},
		{"galactic-hubctl", "delete", "ipam.miloapis.com", "ipclaims", "platform", true},
		{"galactic-hubctl", "create", "ipam.miloapis.com", "ipclaims", "platform", true},
		{"galactic-hubctl", "list", "ipam.miloapis.com", "ipclaims", "platform", true},
		{"galactic-hubctl", "get", "ipam.miloapis.com", "ipallocations", "platform", true},
		// The retention lease: read, never watched or written.
		{"galactic-hubctl", "list", "ipam.miloapis.com", "ipclasses", "", true},
		{"galactic-hubctl", "get", "ipam.miloapis.com", "ippools", "", true},
		{"galactic-hubctl", "watch", "ipam.miloapis.com", "ipclasses", "", false},
		{"galactic-hubctl", "delete", "ipam.miloapis.com", "ippools", "", false},
		{"galactic-hubctl", "delete", "ipam.miloapis.com", "ipallocations", "platform", false},
		{"galactic-hubctl", "update", "ipam.miloapis.com", "ipallocations", "platform", false},
		{"galactic-hubctl", "delete", "ipam.miloapis.com", "ipclaims", "tenant", false},
		{"galactic-hubctl", "create", "cloud.datumapis.com", "networkfabricidentities", "tenant", true},
		{"galactic-hubctl", "delete", "cloud.datumapis.com", "networkfabricidentities", "tenant", true},
		{"galactic-hubctl", "update", "cloud.datumapis.com", "networkfabricidentities", "tenant", false},
		{"galactic-hubctl", "watch", "networking.datumapis.com", "networks", "", true},
		{"galactic-hubctl", "delete", "networking.datumapis.com", "networks", "tenant", false},
		// Placement: the contexts read, the policies written and removed,
		// the identity's location labels patched; nothing more.
		{"galactic-hubctl", "list", "networking.datumapis.com", "networkcontexts", "", true},
		{"galactic-hubctl", "watch", "networking.datumapis.com", "networkcontexts", "", true},
		{"galactic-hubctl", "update", "networking.datumapis.com", "networkcontexts", "tenant", false},
		{"galactic-hubctl", "delete", "networking.datumapis.com", "networkcontexts", "tenant", false},
		{"galactic-hubctl", "create", "policy.karmada.io", "clusterpropagationpolicies", "", true},
		{"galactic-hubctl", "patch", "policy.karmada.io", "clusterpropagationpolicies", "", true},
		{"galactic-hubctl", "delete", "policy.karmada.io", "clusterpropagationpolicies", "", true},
		{"galactic-hubctl", "list", "policy.karmada.io", "clusterpropagationpolicies", "", true},
		{"galactic-hubctl", "watch", "policy.karmada.io", "clusterpropagationpolicies", "", true},
		{"galactic-hubctl", "update", "policy.karmada.io", "clusterpropagationpolicies", "", false},
		{"galactic-hubctl", "deletecollection", "policy.karmada.io", "clusterpropagationpolicies", "", false},
		{"galactic-hubctl", "create", "policy.karmada.io", "propagationpolicies", "tenant", false},
		{"galactic-hubctl", "patch", "cloud.datumapis.com", "networkfabricidentities", "tenant", true},
		{"galactic-hubctl", "create", "authentication.k8s.io", "tokenreviews", "", false},
		// Events: written through events.k8s.io/v1 (a create, and a patch
		// for a repeat's series), on networks and on the platform
		// namespace; never read, updated or deleted, and no core ones.
		{"galactic-hubctl", "create", "events.k8s.io", "events", "tenant", true},
		{"galactic-hubctl", "patch", "events.k8s.io", "events", "platform", true},
		{"galactic-hubctl", "update", "events.k8s.io", "events", "platform", false},
		{"galactic-hubctl", "delete", "events.k8s.io", "events", "platform", false},
		{"galactic-hubctl", "list", "events.k8s.io", "events", "", false},
		{"galactic-hubctl", "create", "", "events", "tenant", false},
		{"galactic-hubctl", "patch", "", "events", "platform", false},
		{"galactic-hubctl", "list", "", "secrets", "platform", false},
	} {
		if got := may(c.sa, c.verb, c.group, c.resource, c.ns); got != c.want {
			t.Errorf("%s %s %s.%s in %q: allowed %v, want %v", c.sa, c.verb, c.resource, c.group, c.ns, got, c.want)
		}
	}
	// hubctl's leader Lease has a fixed name: it may read and renew that
	// one only (and create it: a create names nothing the API server can
	// check before the object exists).
	for _, c := range []struct {
		verb, name string
		want       bool
	}{
		{"get", "galactic-hubctl", true},
		{"update", "galactic-hubctl", true},
		{"create", "", true},
		{"get", "another-lease", false},
		{"update", "another-lease", false},
		{"delete", "galactic-hubctl", false},
	} {
		if got := mayNamed("galactic-hubctl", c.verb, "coordination.k8s.io", "leases", "platform", c.name); got != c.want {
			t.Errorf("galactic-hubctl %s lease %q in platform: allowed %v, want %v", c.verb, c.name, got, c.want)
		}
	}
}

// TestAlertRulesParseAndNameARunbookThatExists parses the rules with
// Prometheus' own parser and checks each alert's runbook_url anchor against
// the headings of docs/operations.md.
func TestAlertRulesParseAndNameARunbookThatExists(t *testing.T) {
	groups, errs := rulefmt.ParseFile("../deploy/alerts/galactic.rules.yaml", false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatalf("rules do not parse: %v", errs)
	}
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[slug(m[1])] = true
	}
	alerts := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			url := r.Annotations["runbook_url"]
			_, anchor, ok := strings.Cut(url, "docs/operations.md#")
			if !ok || !anchors[anchor] {
				t.Errorf("alert %s: runbook_url %q names no section of docs/operations.md", r.Alert, url)
			}
		}
	}
	if alerts < 5 {
		t.Fatalf("%d alerts, want the five of the issue", alerts)
	}
}

// slug is GitHub's heading anchor: lower case, spaces to dashes, most
// punctuation dropped.
func slug(h string) string {
	h = strings.ToLower(strings.TrimSpace(h))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}
