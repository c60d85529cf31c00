package hubctl

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
)

// fenced holds every write of the API it wraps by its Fence: asked right
// before the write, a fence that refuses (a deposed leader) stops it before
// it is sent, and the context it gives ends the write in flight when the
// lease may pass. Reads go through as they are: a deposed leader's reads
// harm no one. The controller wraps its API so at construction, so that no
// write path, present or future, can forget the fence.
type fenced struct {
	API
	fence Fence
}

// hold asks the fence for one write; op names it in the error.
func (f fenced) hold(ctx context.Context, op string) (context.Context, context.CancelFunc, error) {
	wctx, cancel, err := f.fence.Hold(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: not written: %w", op, err)
	}
	return wctx, cancel, nil
}

// CreateFabricIdentity implements API.
func (f fenced) CreateFabricIdentity(ctx context.Context, id FabricIdentity) error {
	ctx, cancel, err := f.hold(ctx, "create fabric identity "+id.Namespace+"/"+id.Name)
	if err != nil {
		return err
	}
	defer cancel()
	return f.API.CreateFabricIdentity(ctx, id)
}

// DeleteFabricIdentity implements API.
func (f fenced) DeleteFabricIdentity(ctx context.Context, namespace, name string) error {
	ctx, cancel, err := f.hold(ctx, "delete fabric identity "+namespace+"/"+name)
	if err != nil {
		return err
	}
	defer cancel()
	return f.API.DeleteFabricIdentity(ctx, namespace, name)
}

// CreateClaim implements API.
func (f fenced) CreateClaim(ctx context.Context, c Claim) (Claim, error) {
	ctx, cancel, err := f.hold(ctx, "create claim "+c.Namespace+"/"+c.Name)
	if err != nil {
		return Claim{}, err
	}
	defer cancel()
	return f.API.CreateClaim(ctx, c)
}

// DeleteClaim implements API.
func (f fenced) DeleteClaim(ctx context.Context, namespace, name string, uid types.UID, resourceVersion string) (types.UID, error) {
	ctx, cancel, err := f.hold(ctx, "delete claim "+namespace+"/"+name)
	if err != nil {
		return "", err
	}
	defer cancel()
	return f.API.DeleteClaim(ctx, namespace, name, uid, resourceVersion)
}

// Event implements API. A deposed leader records nothing: the event would
// speak for a controller that no longer acts. (Recording itself is
// asynchronous, so the fence decides whether the event is handed to the
// recorder, not when the recorder sends it.)
func (f fenced) Event(ctx context.Context, n Network, warning bool, reason, message string) {
	ctx, cancel, err := f.fence.Hold(ctx)
	if err != nil {
		return
	}
	defer cancel()
	f.API.Event(ctx, n, warning, reason, message)
}

// HubEvent implements API, held as Event is.
func (f fenced) HubEvent(ctx context.Context, warning bool, reason, message string) {
	ctx, cancel, err := f.fence.Hold(ctx)
	if err != nil {
		return
	}
	defer cancel()
	f.API.HubEvent(ctx, warning, reason, message)
}

// ClaimEvent implements API, held as Event is.
func (f fenced) ClaimEvent(ctx context.Context, n *Network, c Claim, warning bool, reason, action, message string) {
	ctx, cancel, err := f.fence.Hold(ctx)
	if err != nil {
		return
	}
	defer cancel()
	f.API.ClaimEvent(ctx, n, c, warning, reason, action, message)
}

// fencedPlacement holds every write of the placement API it wraps by its
// Fence, as fenced does the controller's.
type fencedPlacement struct {
	PlacementAPI
	fence Fence
}

// CreatePolicy implements PlacementAPI.
func (f fencedPlacement) CreatePolicy(ctx context.Context, key Key, locations []string) error {
	ctx, cancel, err := fenced{fence: f.fence}.hold(ctx, "create placement policy of "+key.String())
	if err != nil {
		return err
	}
	defer cancel()
	return f.PlacementAPI.CreatePolicy(ctx, key, locations)
}

// ApplyPolicy implements PlacementAPI.
func (f fencedPlacement) ApplyPolicy(ctx context.Context, key Key, locations []string, resourceVersion string) error {
	ctx, cancel, err := fenced{fence: f.fence}.hold(ctx, "apply placement policy of "+key.String())
	if err != nil {
		return err
	}
	defer cancel()
	return f.PlacementAPI.ApplyPolicy(ctx, key, locations, resourceVersion)
}

// DeletePolicy implements PlacementAPI.
func (f fencedPlacement) DeletePolicy(ctx context.Context, name string, uid types.UID) error {
	ctx, cancel, err := fenced{fence: f.fence}.hold(ctx, "delete placement policy "+name)
	if err != nil {
		return err
	}
	defer cancel()
	return f.PlacementAPI.DeletePolicy(ctx, name, uid)
}

// SetIdentityLocations implements PlacementAPI.
func (f fencedPlacement) SetIdentityLocations(ctx context.Context, key Key, add, drop []string) error {
	ctx, cancel, err := fenced{fence: f.fence}.hold(ctx, "label fabric identity "+key.String())
	if err != nil {
		return err
	}
	defer cancel()
	return f.PlacementAPI.SetIdentityLocations(ctx, key, add, drop)
}

// Event implements PlacementAPI, held as fenced's Event is.
func (f fencedPlacement) Event(ctx context.Context, n Network, warning bool, reason, message string) {
	ctx, cancel, err := f.fence.Hold(ctx)
	if err != nil {
		return
	}
	defer cancel()
	f.PlacementAPI.Event(ctx, n, warning, reason, message)
}
