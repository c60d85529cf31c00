// Package kubeauth is the admin API's delegated authentication: a bearer
// token that no token file holds is judged by the API server, with a
// TokenReview and a SubjectAccessReview, as kubelet judges its callers.
// It is apart from package admin so that the HTTP handling, which the
// fuzzer instruments, links no client-go.
package kubeauth

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/datum-cloud/galactic-node/admin"
)

// How long review results are kept, how many, and how long a review may
// take. A negative result is kept briefly, so that a token that just became
// valid, or a user just granted access, is not refused for long.
const (
	AuthnTTL         = time.Minute
	AuthzAllowTTL    = 5 * time.Minute
	NegativeTTL      = 10 * time.Second
	MaxCachedReviews = 4096
	ReviewTimeout    = 5 * time.Second
)

// Reviewer delegates authentication (TokenReview) and authorisation
// (SubjectAccessReview) to the API server, as kubelet does: it is an
// admin.Reviewer that asks about admin.KubeAuthResource in
// admin.KubeAuthGroup, named after the node. Results are
// cached in bounded LRU caches: authentication by the token's SHA-256,
// authorisation by the whole user the TokenReview returned (name, UID,
// groups, extra) and the verb, so that two tokens of one name with
// different groups are judged apart.
type Reviewer struct {
	client kubernetes.Interface
	node   string
	// Timeout bounds each review request; New sets ReviewTimeout.
	Timeout time.Duration

	authn *lru[authnResult]
	authz *lru[bool]
}

type authnResult struct {
	user authnv1.UserInfo
	ok   bool
}

// New returns a delegated authenticator for the node called node.
func New(client kubernetes.Interface, node string) *Reviewer {
	return &Reviewer{client: client, node: node, Timeout: ReviewTimeout,
		authn: newLRU[authnResult](MaxCachedReviews), authz: newLRU[bool](MaxCachedReviews)}
}

// Review authenticates token and asks whether its user may verb this node's
// admin resource. user is empty when the token did not authenticate. A
// token not in the cache needs a unit of the failure budget (nil: no
// budget), spent before its TokenReview and given back when it
// authenticates; without one, Review asks nothing and returns
// admin.ErrNoBudget.
func (k *Reviewer) Review(ctx context.Context, token, verb string, budget admin.Budget) (user string, allowed bool, err error) {
	info, ok, err := k.authenticate(ctx, token, budget)
	if err != nil || !ok {
		return "", false, err
	}
	allowed, err = k.authorize(ctx, info, verb)
	return info.Username, allowed, err
}

func (k *Reviewer) authenticate(ctx context.Context, token string, budget admin.Budget) (authnv1.UserInfo, bool, error) {
	key := sha256.Sum256([]byte(token))
	now := time.Now()
	if r, hit := k.authn.get(key, now); hit {
		return r.user, r.ok, nil
	}
	if budget != nil && !budget.Take(now) {
		return authnv1.UserInfo{}, false, admin.ErrNoBudget
	}
	ctx, cancel := context.WithTimeout(ctx, k.Timeout)
	defer cancel()
	tr, err := k.client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		// Not the caller's failure: the budget is for tokens the API
		// server refused.
		if budget != nil {
			budget.Give()
		}
		return authnv1.UserInfo{}, false, fmt.Errorf("token review: %w", err)
	}
	r := authnResult{user: tr.Status.User, ok: tr.Status.Authenticated}
	ttl := NegativeTTL
	if r.ok {
		ttl = AuthnTTL
		if budget != nil {
			budget.Give()
		}
	}
	k.authn.put(key, r, now.Add(ttl))
	return r.user, r.ok, nil
}

func (k *Reviewer) authorize(ctx context.Context, user authnv1.UserInfo, verb string) (bool, error) {
	key := authzKey(user, verb)
	now := time.Now()
	if allowed, hit := k.authz.get(key, now); hit {
		return allowed, nil
	}
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	ctx, cancel := context.WithTimeout(ctx, k.Timeout)
	defer cancel()
	sar, err := k.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
		ResourceAttributes: &authzv1.ResourceAttributes{Group: admin.KubeAuthGroup, Resource: admin.KubeAuthResource, Name: k.node, Verb: verb},
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("subject access review: %w", err)
	}
	ttl := NegativeTTL
	if sar.Status.Allowed {
		ttl = AuthzAllowTTL
	}
	k.authz.put(key, sar.Status.Allowed, now.Add(ttl))
	return sar.Status.Allowed, nil
}

// authzKey is the SHA-256 of everything a SubjectAccessReview is asked
// about the user, and the verb, each field length-prefixed so that no two
// users encode alike. Groups and extra keys are sorted: their order does not
// change what the authorizer answers.
func authzKey(u authnv1.UserInfo, verb string) [sha256.Size]byte {
	h := sha256.New()
	field := func(s string) {
		_ = binary.Write(h, binary.BigEndian, uint32(len(s)))
		h.Write([]byte(s))
	}
	field(verb)
	field(u.Username)
	field(u.UID)
	groups := slices.Sorted(slices.Values(u.Groups))
	_ = binary.Write(h, binary.BigEndian, uint32(len(groups)))
	for _, g := range groups {
		field(g)
	}
	keys := make([]string, 0, len(u.Extra))
	for k := range u.Extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	_ = binary.Write(h, binary.BigEndian, uint32(len(keys)))
	for _, k := range keys {
		field(k)
		_ = binary.Write(h, binary.BigEndian, uint32(len(u.Extra[k])))
		for _, v := range u.Extra[k] {
			field(v)
		}
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// lru is a cache of at most max entries keyed by a SHA-256, each with an
// expiry; when full, the least recently used entry makes room.
type lru[V any] struct {
	mu    sync.Mutex
	max   int
	order *list.List // front: most recently used; values *lruEntry[V]
	byKey map[[sha256.Size]byte]*list.Element
}

type lruEntry[V any] struct {
	key     [sha256.Size]byte
	value   V
	expires time.Time
}

func newLRU[V any](max int) *lru[V] {
	return &lru[V]{max: max, order: list.New(), byKey: map[[sha256.Size]byte]*list.Element{}}
}

func (c *lru[V]) get(key [sha256.Size]byte, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var zero V
	el, ok := c.byKey[key]
	if !ok {
		return zero, false
	}
	e := el.Value.(*lruEntry[V])
	if !now.Before(e.expires) {
		c.order.Remove(el)
		delete(c.byKey, key)
		return zero, false
	}
	c.order.MoveToFront(el)
	return e.value, true
}

func (c *lru[V]) put(key [sha256.Size]byte, v V, expires time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		e := el.Value.(*lruEntry[V])
		e.value, e.expires = v, expires
		c.order.MoveToFront(el)
		return
	}
	for c.order.Len() >= c.max {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.byKey, oldest.Value.(*lruEntry[V]).key)
	}
	c.byKey[key] = c.order.PushFront(&lruEntry[V]{key: key, value: v, expires: expires})
}

func (c *lru[V]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
