package hubctl

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
)

// A policy name is the fabric identity controller's when it fits, a hash
// when it does not, and always a name the API server accepts.
func TestPolicyNamesFitAndHashWhenLong(t *testing.T) {
	if got := PolicyName("team", "net"); got != "cloud-fabric-identity-team-net" {
		t.Fatalf("PolicyName = %q", got)
	}
	ns, long := strings.Repeat("n", 63), strings.Repeat("a", 253)
	hashed := PolicyName(ns, long)
	if len(hashed) > maxNameLen || !strings.HasPrefix(hashed, PolicyPrefix) || len(validation.IsDNS1123Subdomain(hashed)) > 0 {
		t.Fatalf("PolicyName of a long name = %q (%d chars): want a DNS subdomain of at most %d", hashed, len(hashed), maxNameLen)
	}
	if hashed == PolicyName(ns, long[:252]+"b") {
		t.Fatal("two long names hash alike")
	}
	// The longest name that fits is kept as it is.
	fits := strings.Repeat("b", maxNameLen-len(PolicyPrefix)-len(ns)-1)
	if got := PolicyName(ns, fits); got != PolicyPrefix+ns+"-"+fits {
		t.Fatalf("PolicyName at exactly %d chars = %q, want it unhashed", maxNameLen, got)
	}
}

func policyObj(selectors []any, labelled bool, values ...any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"name": "p", "uid": "u"},
		"spec": map[string]any{"conflictResolution": "Overwrite", "resourceSelectors": selectors,
			"placement": map[string]any{"clusterAffinity": map[string]any{"labelSelector": map[string]any{"matchExpressions": []any{
				map[string]any{"key": LocationTopologyKey, "operator": "In", "values": values},
				map[string]any{"key": "other", "operator": "In", "values": []any{"x"}},
			}}}}},
	}}
	if labelled {
		u.SetLabels(map[string]string{LabelPolicy: "true"})
	}
	return u
}

// A policy is read as an identity's only when its one selector names that
// identity; a selector without a name is the older per-location form.
func TestPoliciesAreReadForWhatTheySelect(t *testing.T) {
	byName := map[string]any{"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity", "namespace": "team", "name": "net"}
	byLabel := map[string]any{"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity",
		"labelSelector": map[string]any{"matchLabels": map[string]any{LocationLabel("dfw"): "true"}}}
	otherKind := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "namespace": "team", "name": "net"}

	p := policyFrom(policyObj([]any{byName}, true, "iad", "dfw", "iad"))
	if !p.selects(Key{"team", "net"}) || p.legacy() || !p.Labelled || !p.Overwrite || !slices.Equal(p.Locations, []string{"dfw", "iad"}) {
		t.Fatalf("per-identity policy read as %+v", p)
	}
	if p.selects(Key{"team", "other"}) {
		t.Fatal("a policy selects a network it does not name")
	}
	if p := policyFrom(policyObj([]any{byLabel}, true, "dfw")); !p.legacy() || p.Selects {
		t.Fatalf("per-location policy read as %+v", p)
	}
	if p := policyFrom(policyObj([]any{byLabel}, false, "dfw")); p.legacy() {
		t.Fatal("a policy without the label is read as ours to sweep")
	}
	for _, sel := range [][]any{{otherKind}, {byName, byName}} {
		if p := policyFrom(policyObj(sel, true, "dfw")); p.Selects {
			t.Fatalf("selectors %v read as selecting one identity", sel)
		}
	}
}
