package ipamtest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/dynamic"

	"github.com/datum-cloud/galactic-node/hubctl"
)

// maxBody bounds what the proxy reads of a request body, as the API
// server's 3 MiB limit does.
const maxBody = 3 << 20

// The attempts and pause of ipam's release of a deleted claim's allocation
// (internal/registry/ipam/ipclaim/storage.go deleteMaxAttempts and the
// backoff of AllocatingREST.Delete's releaseAndDelete loop, a41cd6f1).
const (
	releaseAttempts = 3
	releasePause    = 100 * time.Millisecond
)

// defaultPrefixLength is the block size the proxy hands out, and the size
// of a claim that asks for none (ipam takes the class's
// defaultPrefixLength; the proxy has no classes).
const defaultPrefixLength = 64

func (s *Service) claims(ns string) dynamic.ResourceInterface {
	return s.admin.Resource(hubctl.ClaimResource).Namespace(ns)
}

func (s *Service) allocations(ns string) dynamic.ResourceInterface {
	return s.admin.Resource(hubctl.AllocationResource).Namespace(ns)
}

// statusError turns an ipam refusal into an error writeError renders as is.
func statusError(st *metav1.Status) error { return &apierrors.StatusError{ErrStatus: *st} }

// createClaim carries out an IPClaim CREATE as ipam's AllocatingREST.Create
// does (internal/registry/ipam/ipclaim/storage.go, a41cd6f1): the claim is
// bound before the answer, which is 201 with the claim in phase Bound.
// Milo's quota admission runs first, as admission runs before storage.
//
// ipam writes the claim Bound in one transaction, one ADDED event; the
// API server's status subresource makes it two here (ADDED without a
// status, then MODIFIED Bound), and the same for the allocation. A
// watcher can see a claim with no phase for a moment.
func (s *Service) createClaim(w http.ResponseWriter, r *http.Request, q request) {
	s.mu.Lock()
	s.creates++
	refuse := s.refuse
	s.mu.Unlock()
	if refuse != nil {
		writeStatus(w, refuse)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("read IPClaim: %v", err)))
		return
	}
	obj := &unstructured.Unstructured{}
	if err := obj.UnmarshalJSON(body); err != nil {
		writeError(w, apierrors.NewBadRequest(fmt.Sprintf("decode IPClaim: %v", err)))
		return
	}
	if obj.GetNamespace() == "" {
		obj.SetNamespace(q.namespace)
	}
	if obj.GetName() == "" && obj.GetGenerateName() != "" {
		// The allocation is named after the claim, so the name is fixed
		// here rather than by the API server.
		obj.SetName(obj.GetGenerateName() + utilrand.String(5))
	}
	opts := metav1.CreateOptions{
		FieldManager:    r.URL.Query().Get("fieldManager"),
		FieldValidation: r.URL.Query().Get("fieldValidation"),
	}

	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.opts.QuotaLimit > 0 {
		s.mu.Lock()
		full := s.quotaUsed >= s.opts.QuotaLimit
		s.mu.Unlock()
		if full {
			writeStatus(w, s.quotaDenied(obj.GetName()))
			return
		}
	}
	claim, err := s.bind(r.Context(), q.namespace, obj, opts)
	if err != nil {
		writeError(w, err)
		return
	}
	s.mu.Lock()
	s.quotaUsed++
	s.quotaClaims[string(claim.GetUID())] = true
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, claim.Object)
}

// bind stores claim bound to an allocation: a retained one of its name,
// re-bound (RetainedRebind), or a new one. Called under writeMu.
//
// The probe is ipam's phase 1a at a41cd6f1 (storage.go
// AllocatingREST.Create → reclaimRetained): a bound allocation refuses with
// the Conflict of internal/allocator/reclaim.go ReclaimRetained ("already
// bound to" the claim's storage key), or AlreadyExists when the claim
// itself is there (registryerrors.MapWriteError on the claim insert). The
// answer to a retained one is Options.Retained's. At 012be054 a create of
// a live claim's name met the same "retained by an earlier claim" Conflict
// as a retained one (isIdentityCollision fires on any row under the key);
// the proxy answers it AlreadyExists in every mode, as the contract asks.
func (s *Service) bind(ctx context.Context, ns string, claim *unstructured.Unstructured, opts metav1.CreateOptions) (*unstructured.Unstructured, error) {
	name := claim.GetName()
	// Validation, the namespace and the like are the API server's to
	// refuse, as ipam's strategy and namespace checks refuse them before
	// its storage probes the allocation; a dry run asks it without
	// writing. AlreadyExists is left to the probe, which ipam runs first.
	dry := opts
	dry.DryRun = []string{metav1.DryRunAll}
	if _, err := s.claims(ns).Create(ctx, claim, dry); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	exists := true
	if _, err := s.claims(ns).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		exists = false
	} else if err != nil {
		return nil, fmt.Errorf("read claim %s/%s: %w", ns, name, err)
	}
	allocName := hubctl.AllocationName(ns, name)
	alloc, err := s.allocations(ns).Get(ctx, allocName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if exists {
			// MapWriteError: ErrObjectExists → NewAlreadyExists.
			return nil, apierrors.NewAlreadyExists(claimsGR, name)
		}
		return s.bindNew(ctx, ns, claim, opts)
	case err != nil:
		return nil, fmt.Errorf("read allocation %s/%s: %w", ns, allocName, err)
	}
	if ref := nestedString(alloc, "spec", "claimRef", "name"); ref != "" {
		if exists {
			return nil, apierrors.NewAlreadyExists(claimsGR, name)
		}
		// internal/allocator/reclaim.go: a row already bound is what a
		// duplicate create of a live claim hits.
		return nil, statusError(mismatch(name, fmt.Errorf("%w: an allocation under this identity is already bound to %q", errRetainedMismatch, s.claimKey(ns, ref))))
	}
	if s.opts.Retained != RetainedRebind {
		return nil, statusError(retainedConflict(s.opts.Retained, name, allocName))
	}
	if err := fits(alloc, claim); err != nil {
		return nil, statusError(mismatch(name, err))
	}
	if exists {
		return nil, apierrors.NewAlreadyExists(claimsGR, name)
	}
	return s.rebind(ctx, ns, claim, alloc, opts)
}

// claimKey is a claim's storage key as ipam quotes it (storage.go claim
// key, a41cd6f1): the tenant prefix (internal/tenant Identity.ApplyPrefix,
// project/<id>; none without a project) on
// /ipam.miloapis.com/ipclaims/<namespace>/<name>.
func (s *Service) claimKey(ns, name string) string {
	key := fmt.Sprintf("/%s/ipclaims/%s/%s", Group, ns, name)
	if s.opts.Project != "" {
		key = "project/" + s.opts.Project + key
	}
	return key
}

// fits is ipam's reclaimAgrees (internal/allocator/reclaim.go, a41cd6f1) over what
// the proxy records: the class and the prefix length must be the
// allocation's. ipam compares the scope's digest too; the proxy records
// no scope.
func fits(alloc, claim *unstructured.Unstructured) error {
	had, want := nestedString(alloc, "spec", "className"), nestedString(claim, "spec", "className")
	if had != want {
		return fmt.Errorf("%w: it was allocated under class %q and this claim names %q", errRetainedMismatch, had, want)
	}
	if had, want := prefixLength(alloc), prefixLength(claim); had != want {
		return fmt.Errorf("%w: it is a /%d and this claim asks for a /%d", errRetainedMismatch, had, want)
	}
	return nil
}

// bindNew issues a block and binds it, as ipam's AllocatingREST.Create
// (storage.go, a41cd6f1) does in one transaction: the allocation, named
// allocationNameFor(namespace, name) (hubctl.AllocationName), bound by
// claimRef, its reclaimPolicy the claim's effectiveReclaimPolicy, Ready
// with the block; then the claim, Bound to it. The allocation records the
// class and prefix length reclaimAgrees compares. A failure undoes what
// was written, as ipam's transaction would never have happened.
func (s *Service) bindNew(ctx context.Context, ns string, claim *unstructured.Unstructured, opts metav1.CreateOptions) (*unstructured.Unstructured, error) {
	name := claim.GetName()
	allocName := hubctl.AllocationName(ns, name)
	n := s.takeBlock()
	cidr := blockCIDR(n)
	policy := nestedString(claim, "spec", "reclaimPolicy")
	if policy == "" {
		// effectiveReclaimPolicy: the claim's, else the class's, else
		// Delete; the proxy has no classes.
		policy = "Delete"
	}
	spec := map[string]any{
		"claimRef":      map[string]any{"name": name},
		"reclaimPolicy": policy,
		"prefixLength":  int64(prefixLength(claim)),
	}
	if class := nestedString(claim, "spec", "className"); class != "" {
		spec["className"] = class
	}
	if owner, ok, _ := unstructured.NestedMap(claim.Object, "spec", "ownerRef"); ok {
		spec["ownerRef"] = owner
	}
	alloc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": hubctl.AllocationResource.GroupVersion().String(), "kind": "IPAllocation",
		"metadata": map[string]any{"namespace": ns, "name": allocName},
		"spec":     spec,
	}}
	created, err := s.allocations(ns).Create(ctx, alloc, metav1.CreateOptions{})
	if err != nil {
		s.freeBlock(n)
		return nil, err
	}
	undoAlloc := func() {
		// A fresh context: the request's may be what ended.
		uid := created.GetUID()
		_ = s.allocations(ns).Delete(context.WithoutCancel(ctx), allocName, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		s.freeBlock(n)
	}
	if _, err := s.updateStatus(ctx, s.allocations(ns), created, func(st map[string]any) {
		st["phase"] = "Ready"
		st["allocatedCIDR"] = cidr
	}); err != nil {
		undoAlloc()
		return nil, fmt.Errorf("set status of allocation %s/%s: %w", ns, allocName, err)
	}
	stored, err := s.claims(ns).Create(ctx, claim, opts)
	if err != nil {
		undoAlloc()
		return nil, err
	}
	bound, err := s.updateStatus(ctx, s.claims(ns), stored, boundStatus(cidr, allocName))
	if err != nil {
		uid := stored.GetUID()
		_ = s.claims(ns).Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		undoAlloc()
		return nil, fmt.Errorf("set status of claim %s/%s: %w", ns, name, err)
	}
	return bound, nil
}

// boundStatus is a bound claim's status (storage.go AllocatingREST.Create,
// a41cd6f1: phase Bound, allocatedCIDR, boundAllocationRef). strategy.go
// PrepareForCreate reset everything else, so no condition.
func boundStatus(cidr, allocName string) func(map[string]any) {
	return func(st map[string]any) {
		clear(st)
		st["phase"] = "Bound"
		st["allocatedCIDR"] = cidr
		st["boundAllocationRef"] = map[string]any{"name": allocName}
	}
}

// rebind is ipam's reclaimRetained at a41cd6f1 (storage.go, and
// internal/allocator/reclaim.go ReclaimRetained): the retained
// allocation is bound to the new claim (claimRef and ownerRef, phase Ready,
// the lease's Expiring condition dropped, Bound=True Reclaimed), and the
// claim is stored Bound to it with the allocation's CIDR. The Reclaimed
// condition is on the allocation, never on the claim.
func (s *Service) rebind(ctx context.Context, ns string, claim, alloc *unstructured.Unstructured, opts metav1.CreateOptions) (*unstructured.Unstructured, error) {
	name := claim.GetName()
	allocName := alloc.GetName()
	cidr := nestedString(alloc, "status", "allocatedCIDR")
	owner, hasOwner, _ := unstructured.NestedMap(claim.Object, "spec", "ownerRef")
	a := alloc.DeepCopy()
	_ = unstructured.SetNestedMap(a.Object, map[string]any{"name": name}, "spec", "claimRef")
	if hasOwner {
		_ = unstructured.SetNestedMap(a.Object, owner, "spec", "ownerRef")
	} else {
		unstructured.RemoveNestedField(a.Object, "spec", "ownerRef")
	}
	updated, err := s.allocations(ns).Update(ctx, a, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("re-bind allocation %s/%s: %w", ns, allocName, err)
	}
	if _, err := s.updateStatus(ctx, s.allocations(ns), updated, func(st map[string]any) {
		st["phase"] = "Ready"
		conds := withoutCondition(st["conditions"], "Expiring")
		st["conditions"] = setCondition(conds, "Bound", "True", "Reclaimed", fmt.Sprintf("recovered by replacement claim %q", name))
	}); err != nil {
		s.unbind(context.WithoutCancel(ctx), ns, allocName)
		return nil, fmt.Errorf("set status of allocation %s/%s: %w", ns, allocName, err)
	}
	stored, err := s.claims(ns).Create(ctx, claim, opts)
	if err != nil {
		s.unbind(context.WithoutCancel(ctx), ns, allocName)
		return nil, err
	}
	bound, err := s.updateStatus(ctx, s.claims(ns), stored, boundStatus(cidr, allocName))
	if err != nil {
		uid := stored.GetUID()
		_ = s.claims(ns).Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		s.unbind(context.WithoutCancel(ctx), ns, allocName)
		return nil, fmt.Errorf("set status of claim %s/%s: %w", ns, name, err)
	}
	return bound, nil
}

// unbind undoes a re-bind that could not finish, leaving the allocation
// retained again; best effort, as it runs only on a failure already being
// answered.
func (s *Service) unbind(ctx context.Context, ns, allocName string) {
	alloc, err := s.allocations(ns).Get(ctx, allocName, metav1.GetOptions{})
	if err == nil {
		_ = s.retain(ctx, ns, alloc)
	}
}

// deleteClaim carries out an IPClaim DELETE as ipam's AllocatingREST.Delete
// does (internal/registry/ipam/ipclaim/storage.go, a41cd6f1, the same at
// 012be054): the preconditions,
// grace period and propagation policy are never read; the claim is read,
// published in phase Releasing (TX1, a MODIFIED event), its allocation
// released under its reclaimPolicy and the claim deleted (TX2), and the
// answer is 200 with the claim as TX1 stored it, not a Status. Nothing
// sets a deletionTimestamp.
func (s *Service) deleteClaim(w http.ResponseWriter, r *http.Request, q request) {
	s.mu.Lock()
	hook := s.beforeDelete
	s.mu.Unlock()
	if hook != nil {
		hook(q.namespace, q.name)
	}
	dryRun := isDryRun(r)
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	releasing, err := s.release(r.Context(), q.namespace, q.name, dryRun)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, releasing.Object)
}

// deleteClaims carries out a DELETECOLLECTION of ipclaims as ipam's
// AllocatingREST.DeleteCollection does (storage.go, a41cd6f1): Delete, with
// the same options, for each claim the selectors match, answered with the
// list of what each Delete returned.
func (s *Service) deleteClaims(w http.ResponseWriter, r *http.Request, q request) {
	list, err := s.claims(q.namespace).List(r.Context(), metav1.ListOptions{
		LabelSelector: r.URL.Query().Get("labelSelector"),
		FieldSelector: r.URL.Query().Get("fieldSelector"),
	})
	if err != nil {
		writeError(w, err)
		return
	}
	s.mu.Lock()
	hook := s.beforeDelete
	s.mu.Unlock()
	dryRun := isDryRun(r)
	items := []any{}
	for i := range list.Items {
		ns, name := list.Items[i].GetNamespace(), list.Items[i].GetName()
		if hook != nil {
			hook(ns, name)
		}
		s.writeMu.Lock()
		releasing, err := s.release(r.Context(), ns, name, dryRun)
		s.writeMu.Unlock()
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			writeError(w, err)
			return
		}
		items = append(items, releasing.Object)
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"apiVersion": hubctl.ClaimResource.GroupVersion().String(), "kind": "IPClaimList",
		"metadata": map[string]any{"resourceVersion": list.GetResourceVersion()},
		"items":    items,
	})
}

// isDryRun reads dryRun from the query or from a DeleteOptions body: the
// one option ipam's Delete reads (storage.go isDryRun, a41cd6f1).
func isDryRun(r *http.Request) bool {
	if len(r.URL.Query()["dryRun"]) > 0 {
		return true
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil || len(body) == 0 {
		return false
	}
	var opts metav1.DeleteOptions
	if err := json.Unmarshal(body, &opts); err != nil {
		return false
	}
	return len(opts.DryRun) > 0
}

// release is the body of ipam's AllocatingREST.Delete (storage.go,
// a41cd6f1): Get (a missing claim is its 404), dry run answered with the
// claim unchanged, TX1 (UpdateObject of the claim in phase Releasing), TX2
// (releaseAndDelete: the allocation released, then DeleteObject of the
// claim), `return releasing, true, nil`. Called under writeMu.
func (s *Service) release(ctx context.Context, ns, name string, dryRun bool) (*unstructured.Unstructured, error) {
	claim, err := s.claims(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if dryRun {
		return claim, nil
	}
	if len(claim.GetFinalizers()) > 0 {
		// ipam's claims carry none, and a finalizer would make the API
		// server set a deletionTimestamp, which ipam never does.
		claim.SetFinalizers(nil)
		if claim, err = s.claims(ns).Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("drop finalizers of claim %s/%s: %w", ns, name, err)
		}
	}
	releasing, err := s.updateStatus(ctx, s.claims(ns), claim, func(st map[string]any) { st["phase"] = "Releasing" })
	if err != nil {
		return nil, fmt.Errorf("publish claim %s/%s releasing: %w", ns, name, err)
	}
	var last error
	for attempt := 1; attempt <= releaseAttempts; attempt++ {
		if last = s.releaseAllocation(ctx, ns, releasing); last == nil {
			break
		}
		if attempt < releaseAttempts {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(releasePause):
			}
		}
	}
	if last != nil {
		// A plain error in ipam, so a 500, and the claim stays Releasing.
		return nil, apierrors.NewInternalError(fmt.Errorf("release allocation after %d attempts: %w", releaseAttempts, last))
	}
	if err := s.claims(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return nil, apierrors.NewInternalError(fmt.Errorf("delete claim %s/%s: %w", ns, name, err))
	}
	s.mu.Lock()
	s.deletes++
	counted := s.quotaClaims[string(claim.GetUID())]
	delete(s.quotaClaims, string(claim.GetUID()))
	s.mu.Unlock()
	if counted {
		s.returnUnit()
	}
	return releasing, nil
}

// releaseAllocation releases the allocation bound to claim (ipam's
// releaseAndDelete, storage.go, a41cd6f1): under Retain it is kept with its claimRef cleared,
// under Delete it is deleted and its block free to be issued again. An
// allocation bound to another claim, or none, is left alone.
func (s *Service) releaseAllocation(ctx context.Context, ns string, claim *unstructured.Unstructured) error {
	allocName := nestedString(claim, "status", "boundAllocationRef", "name")
	if allocName == "" {
		allocName = hubctl.AllocationName(ns, claim.GetName())
	}
	alloc, err := s.allocations(ns).Get(ctx, allocName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read allocation %s/%s: %w", ns, allocName, err)
	}
	if nestedString(alloc, "spec", "claimRef", "name") != claim.GetName() {
		return nil
	}
	if nestedString(alloc, "spec", "reclaimPolicy") == "Retain" {
		return s.retain(ctx, ns, alloc)
	}
	uid := alloc.GetUID()
	err = s.allocations(ns).Delete(ctx, allocName, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete allocation %s/%s: %w", ns, allocName, err)
	}
	if n, ok := blockNumber(nestedString(alloc, "status", "allocatedCIDR")); ok {
		s.freeBlock(n)
	}
	return nil
}

// retain is ipam's unbindAllocation (storage.go, a41cd6f1): claimRef
// cleared (ownerRef kept) and the condition Bound=False Retained set.
func (s *Service) retain(ctx context.Context, ns string, alloc *unstructured.Unstructured) error {
	a := alloc.DeepCopy()
	unstructured.RemoveNestedField(a.Object, "spec", "claimRef")
	updated, err := s.allocations(ns).Update(ctx, a, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("unbind allocation %s/%s: %w", ns, alloc.GetName(), err)
	}
	_, err = s.updateStatus(ctx, s.allocations(ns), updated, func(st map[string]any) {
		st["conditions"] = setCondition(st["conditions"], "Bound", "False", "Retained",
			"the claim was deleted under reclaimPolicy Retain; this address is still held")
	})
	if err != nil {
		return fmt.Errorf("set status of allocation %s/%s: %w", ns, alloc.GetName(), err)
	}
	return nil
}

// updateStatus writes mutate's change to obj's status through the status
// subresource, reading the object again when someone else wrote it first.
func (s *Service) updateStatus(ctx context.Context, ri dynamic.ResourceInterface, obj *unstructured.Unstructured, mutate func(map[string]any)) (*unstructured.Unstructured, error) {
	for {
		o := obj.DeepCopy()
		st, _, _ := unstructured.NestedMap(o.Object, "status")
		if st == nil {
			st = map[string]any{}
		}
		mutate(st)
		o.Object["status"] = st
		out, err := ri.UpdateStatus(ctx, o, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return out, err
		}
		if obj, err = ri.Get(ctx, obj.GetName(), metav1.GetOptions{}); err != nil {
			return nil, err
		}
	}
}

// returnUnit gives a quota unit back QuotaReturnDelay from now, as Milo's
// garbage collector deletes the ResourceClaim of a deleted object some time
// after it went.
func (s *Service) returnUnit() {
	if s.opts.QuotaReturnDelay <= 0 {
		s.mu.Lock()
		s.quotaUsed--
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTimer(s.opts.QuotaReturnDelay)
		defer t.Stop()
		select {
		case <-t.C:
			s.mu.Lock()
			s.quotaUsed--
			s.mu.Unlock()
		case <-s.ctx.Done():
		}
	}()
}

// takeBlock picks the number of the block to issue: the lowest released
// one, as a first-fit allocator would (ipam's pools default to FirstFit),
// else the next never issued.
func (s *Service) takeBlock() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.freeBlocks) > 0 {
		free := make([]uint32, 0, len(s.freeBlocks))
		for n := range s.freeBlocks {
			free = append(free, n)
		}
		n := slices.Min(free)
		delete(s.freeBlocks, n)
		return n
	}
	n := s.nextBlock
	s.nextBlock++
	if s.nextBlock&0xffff == 0 {
		// A low half of 0 would make a block whose fabric identity
		// (hubctl.FabricIDFromBlock, the bits 32 to 64) is 0.
		s.nextBlock++
	}
	return n
}

// freeBlock makes block n free to be issued again, if the proxy issued it.
func (s *Service) freeBlock(n uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > 0 && n < s.nextBlock {
		s.freeBlocks[n] = true
	}
}

// blockCIDR is block n: fd00:<hi>:<lo>::/64, hi and lo the halves of n.
// hubctl.FabricIDFromBlock reads lo<<16 from it, which takeBlock keeps
// from being 0.
func blockCIDR(n uint32) string {
	var b [16]byte
	b[0], b[1] = 0xfd, 0x00
	binary.BigEndian.PutUint32(b[2:6], n)
	return netip.PrefixFrom(netip.AddrFrom16(b), 64).String()
}

// blockNumber reads n back from a block blockCIDR made.
func blockNumber(cidr string) (uint32, bool) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil || p.Bits() != 64 || !p.Addr().Is6() {
		return 0, false
	}
	b := p.Addr().As16()
	if b[0] != 0xfd || b[1] != 0x00 {
		return 0, false
	}
	for _, x := range b[6:] {
		if x != 0 {
			return 0, false
		}
	}
	return binary.BigEndian.Uint32(b[2:6]), true
}

func nestedString(u *unstructured.Unstructured, fields ...string) string {
	s, _, _ := unstructured.NestedString(u.Object, fields...)
	return s
}

// prefixLength is the size a claim asks for, or an allocation records:
// spec.prefixLength, else the default.
func prefixLength(u *unstructured.Unstructured) int {
	v, ok, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "prefixLength")
	if !ok {
		return defaultPrefixLength
	}
	switch v := v.(type) {
	case int64:
		return int(v)
	case float64:
		return int(v)
	case int:
		return v
	}
	return defaultPrefixLength
}

// withoutCondition is conds without the condition of type typ.
func withoutCondition(conds any, typ string) []any {
	list, _ := conds.([]any)
	out := make([]any, 0, len(list))
	for _, c := range list {
		if m, ok := c.(map[string]any); ok && m["type"] == typ {
			continue
		}
		out = append(out, c)
	}
	return out
}

// setCondition sets a condition as meta.SetStatusCondition does: its
// lastTransitionTime moves only when its status changes.
func setCondition(conds any, typ, status, reason, message string) []any {
	list, _ := conds.([]any)
	now := time.Now().UTC().Format(time.RFC3339)
	c := map[string]any{"type": typ, "status": status, "reason": reason, "message": message, "lastTransitionTime": now}
	out := make([]any, 0, len(list)+1)
	replaced := false
	for _, old := range list {
		m, ok := old.(map[string]any)
		if !ok || m["type"] != typ {
			out = append(out, old)
			continue
		}
		if m["status"] == status && m["lastTransitionTime"] != nil {
			c["lastTransitionTime"] = m["lastTransitionTime"]
		}
		out = append(out, c)
		replaced = true
	}
	if !replaced {
		out = append(out, c)
	}
	return out
}
