package hubctl

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// kube-apiserver words a failed delete precondition two ways, by where it
// is checked; each maps to its sentinel, and a 409 of another kind to none.
// (The cluster tests meet the first wording for real.)
func TestFailedPreconditionsMapToTheirSentinels(t *testing.T) {
	claims := schema.GroupResource{Group: "ipam.miloapis.com", Resource: "IPClaim"}
	conflict := func(msg string) error { return apierrors.NewConflict(claims, "fabric-identity.a.b", errors.New(msg)) }
	for _, tc := range []struct {
		err  error
		want error
	}{
		{conflict("the UID in the precondition (1) does not match the UID in record (2). The object might have been deleted and then recreated"), ErrPrecondition},
		{conflict("Precondition failed: UID in precondition: 1, UID in object meta: 2"), ErrPrecondition},
		{conflict("the ResourceVersion in the precondition (7) does not match the ResourceVersion in record (8). The object might have been modified"), ErrChanged},
		{conflict("Precondition failed: ResourceVersion in precondition: 7, ResourceVersion in object meta: 8"), ErrChanged},
	} {
		if got := mapErr(tc.err); !errors.Is(got, tc.want) {
			t.Errorf("%v: mapped to %v, want %v", tc.err, got, tc.want)
		}
	}
	other := mapErr(conflict("the object has been modified; please apply your changes to the latest version"))
	for _, sentinel := range []error{ErrPrecondition, ErrChanged} {
		if errors.Is(other, sentinel) {
			t.Errorf("an update conflict mapped to %v", sentinel)
		}
	}
}

// The UID of the claim a DELETE answered, in each form a server sends it:
// kube-apiserver's generic store (CRDs among them) a Status whose details
// carry it (registry.Store.finalizeDelete), ipam the claim itself in phase
// Releasing (AllocatingREST.Delete), and a Status naming none.
func TestTheDeletedClaimIsReadFromEachFormOfAnswer(t *testing.T) {
	for _, tc := range []struct {
		what, body string
		want       types.UID
	}{
		{"kube-apiserver Status", `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success","details":{"name":"fabric-identity.a.b","group":"ipam.miloapis.com","kind":"ipclaims","uid":"u-1"}}`, "u-1"},
		{"ipam's claim", `{"kind":"IPClaim","apiVersion":"ipam.miloapis.com/v1alpha1","metadata":{"name":"fabric-identity.a.b","uid":"u-2"},"status":{"phase":"Releasing"}}`, "u-2"},
		{"a Status naming none", `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success"}`, ""},
		{"no JSON", `ok`, ""},
	} {
		if got := deletedUID([]byte(tc.body)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.what, got, tc.want)
		}
	}
}
