package hubctl

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
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
