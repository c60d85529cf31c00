package hub

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/datum-cloud/galactic-node/hubctl"
)

// quotaResource is what the platform's ResourceQuota counts in the CRD
// model: its claims.
const quotaResource = "count/ipclaims.ipam.miloapis.com"

const standInFinalizer = "ipam.miloapis.com/allocation"

// standIn is the address service of the CRD model, in the test process,
// as hubctl's cluster tests play it, and a little more: it binds each new
// claim to an allocation named after it with the claim's reclaim policy
// (Delete when it names none), re-binds a retained allocation to a claim
// of its name (the block stays the name's, as ipam a41cd6f1 does), holds a
// finalizer on claims so that a deleted claim's Retain allocation is kept
// with claimRef cleared and any other is deleted, its block free again,
// and recounts the quota's usage, which nothing else does without
// kube-controller-manager. A freed block is issued again first, as a
// first-fit allocator would: a block wrongly freed is soon another
// network's, which the checker sees.
type standIn struct {
	dyn dynamic.Interface
	cs  kubernetes.Interface
	ns  string
	log *slog.Logger

	mu   sync.Mutex
	next uint32
	free []uint32
}

func (s *standIn) run(ctx context.Context) {
	for {
		if err := s.step(ctx); err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			s.log.Debug("address service stand-in", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *standIn) claims() dynamic.ResourceInterface {
	return s.dyn.Resource(hubctl.ClaimResource).Namespace(s.ns)
}

func (s *standIn) allocations() dynamic.ResourceInterface {
	return s.dyn.Resource(hubctl.AllocationResource).Namespace(s.ns)
}

// step settles every claim once: the deleted ones finalized, the new ones
// bound; then the quota recounted.
func (s *standIn) step(ctx context.Context) error {
	list, err := s.claims().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list claims: %w", err)
	}
	for i := range list.Items {
		c := &list.Items[i]
		switch {
		case c.GetDeletionTimestamp() != nil:
			if len(c.GetFinalizers()) > 0 {
				if err := s.finalize(ctx, c); err != nil {
					return err
				}
			}
		case nestedString(c, "status", "phase") != "Bound":
			if err := s.bind(ctx, c); err != nil {
				return err
			}
		}
	}
	return s.recount(ctx)
}

// finalize releases a deleted claim's allocation under its policy and lets
// the claim go.
func (s *standIn) finalize(ctx context.Context, c *unstructured.Unstructured) error {
	allocName := hubctl.AllocationName(s.ns, c.GetName())
	a, err := s.allocations().Get(ctx, allocName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("read allocation %s: %w", allocName, err)
	case nestedString(a, "spec", "claimRef", "name") != c.GetName():
		// Bound to another claim of the name since: not this claim's.
	case nestedString(a, "spec", "reclaimPolicy") == hubctl.PolicyRetain:
		unstructured.RemoveNestedField(a.Object, "spec", "claimRef")
		if _, err := s.allocations().Update(ctx, a, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("retain allocation %s: %w", allocName, err)
		}
	default:
		uid := a.GetUID()
		if err := s.allocations().Delete(ctx, allocName, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete allocation %s: %w", allocName, err)
		}
		if fid, err := hubctl.FabricIDFromBlock(nestedString(a, "status", "allocatedCIDR")); err == nil {
			s.freeBlock(fid)
		}
	}
	c.SetFinalizers(nil)
	if _, err := s.claims().Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("finalize claim %s: %w", c.GetName(), err)
	}
	return nil
}

// bind binds a new claim: to the retained allocation of its name, or to a
// new one.
func (s *standIn) bind(ctx context.Context, c *unstructured.Unstructured) error {
	if len(c.GetFinalizers()) == 0 {
		c.SetFinalizers([]string{standInFinalizer})
		held, err := s.claims().Update(ctx, c, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("hold claim %s: %w", c.GetName(), err)
		}
		c = held
	}
	allocName := hubctl.AllocationName(s.ns, c.GetName())
	a, err := s.allocations().Get(ctx, allocName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if a, err = s.allocate(ctx, c, allocName); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("read allocation %s: %w", allocName, err)
	default:
		switch ref := nestedString(a, "spec", "claimRef", "name"); ref {
		case c.GetName():
		case "":
			// Retained for this name: re-bound, its block and policy kept.
			_ = unstructured.SetNestedMap(a.Object, map[string]any{"name": c.GetName()}, "spec", "claimRef")
			if a, err = s.allocations().Update(ctx, a, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("re-bind allocation %s: %w", allocName, err)
			}
		default:
			return nil // held by a claim being finalized: the next step binds
		}
	}
	block := nestedString(a, "status", "allocatedCIDR")
	if block == "" {
		return nil
	}
	c.Object["status"] = map[string]any{"phase": "Bound", "allocatedCIDR": block, "boundAllocationRef": map[string]any{"name": allocName}}
	if _, err := s.claims().UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("bind claim %s: %w", c.GetName(), err)
	}
	return nil
}

// allocate issues a block to claim c under the allocation allocName, with
// the claim's policy.
func (s *standIn) allocate(ctx context.Context, c *unstructured.Unstructured, allocName string) (*unstructured.Unstructured, error) {
	policy := nestedString(c, "spec", "reclaimPolicy")
	if policy == "" {
		policy = hubctl.PolicyDelete
	}
	n := s.takeBlock()
	created, err := s.allocations().Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPAllocation",
		"metadata": map[string]any{"namespace": s.ns, "name": allocName},
		"spec":     map[string]any{"claimRef": map[string]any{"name": c.GetName()}, "reclaimPolicy": policy},
	}}, metav1.CreateOptions{})
	if err != nil {
		s.freeBlock(n)
		return nil, fmt.Errorf("create allocation %s: %w", allocName, err)
	}
	created.Object["status"] = map[string]any{"phase": "Bound", "allocatedCIDR": blockCIDR(n)}
	if created, err = s.allocations().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("set block of allocation %s: %w", allocName, err)
	}
	return created, nil
}

func (s *standIn) takeBlock() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.free) > 0 {
		slices.Sort(s.free)
		n := s.free[0]
		s.free = s.free[1:]
		return n
	}
	s.next++
	return s.next
}

func (s *standIn) freeBlock(n uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > 0 && n <= s.next && !slices.Contains(s.free, n) {
		s.free = append(s.free, n)
	}
}

// blockCIDR is block n, whose fabric ID (hubctl.FabricIDFromBlock) is n.
func blockCIDR(n uint32) string { return fmt.Sprintf("fd00:0:%x:%x::/64", n>>16, n&0xffff) }

// recount writes the number of claims as the quota's usage. The quota is
// read first and written with that read's resourceVersion: a claim the
// quota admits after the read changes it, so a count that may predate
// that claim fails with a conflict instead of letting one claim too many
// in (hubctl's cluster tests do the same).
func (s *standIn) recount(ctx context.Context) error {
	rqs := s.cs.CoreV1().ResourceQuotas(s.ns)
	list, err := rqs.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list quotas: %w", err)
	}
	claims, err := s.claims().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("count claims: %w", err)
	}
	want := resource.MustParse(fmt.Sprint(len(claims.Items)))
	for i := range list.Items {
		rq := &list.Items[i]
		if got, ok := rq.Status.Used[quotaResource]; ok && got.Cmp(want) == 0 && rq.Status.Hard != nil {
			continue
		}
		rq.Status.Hard = rq.Spec.Hard
		rq.Status.Used = corev1.ResourceList{quotaResource: want}
		if _, err := rqs.UpdateStatus(ctx, rq, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("recount quota: %w", err)
		}
	}
	return nil
}

func nestedString(u *unstructured.Unstructured, fields ...string) string {
	s, _, _ := unstructured.NestedString(u.Object, fields...)
	return s
}
