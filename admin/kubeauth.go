package admin

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Group and resource of the virtual resource that SubjectAccessReviews ask
// about: read routes need "get", forcing a pass needs "create".
const (
	KubeAuthGroup    = "galactic.datum.net"
	KubeAuthResource = "nodes"
)

// KubeAuth delegates authentication (TokenReview) and authorisation
// (SubjectAccessReview) to the API server, as kubelet does, caching results
// briefly: authentication 1 min, allow 5 min, deny 30 s.
type KubeAuth struct {
	client kubernetes.Interface
	node   string

	mu    sync.Mutex
	authn map[[sha256.Size]byte]authnResult
	authz map[authzKey]authzResult
}

type authnResult struct {
	user    authnv1.UserInfo
	ok      bool
	expires time.Time
}

type authzKey struct {
	user string
	verb string
}

type authzResult struct {
	allowed bool
	expires time.Time
}

// NewKubeAuth returns a delegated authenticator for the node called node.
func NewKubeAuth(client kubernetes.Interface, node string) *KubeAuth {
	return &KubeAuth{client: client, node: node, authn: map[[sha256.Size]byte]authnResult{}, authz: map[authzKey]authzResult{}}
}

// Review authenticates token and asks whether its user may verb this node's
// admin resource. user is empty when the token did not authenticate.
func (k *KubeAuth) Review(ctx context.Context, token, verb string) (user string, allowed bool, err error) {
	info, ok, err := k.authenticate(ctx, token)
	if err != nil || !ok {
		return "", false, err
	}
	allowed, err = k.authorize(ctx, info, verb)
	return info.Username, allowed, err
}

func (k *KubeAuth) authenticate(ctx context.Context, token string) (authnv1.UserInfo, bool, error) {
	key := sha256.Sum256([]byte(token))
	now := time.Now()
	k.mu.Lock()
	if r, hit := k.authn[key]; hit && now.Before(r.expires) {
		k.mu.Unlock()
		return r.user, r.ok, nil
	}
	k.mu.Unlock()
	tr, err := k.client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return authnv1.UserInfo{}, false, fmt.Errorf("token review: %w", err)
	}
	r := authnResult{user: tr.Status.User, ok: tr.Status.Authenticated, expires: now.Add(time.Minute)}
	k.mu.Lock()
	prune(k.authn, now, func(r authnResult) time.Time { return r.expires })
	k.authn[key] = r
	k.mu.Unlock()
	return r.user, r.ok, nil
}

func (k *KubeAuth) authorize(ctx context.Context, user authnv1.UserInfo, verb string) (bool, error) {
	key := authzKey{user: user.Username, verb: verb}
	now := time.Now()
	k.mu.Lock()
	if r, hit := k.authz[key]; hit && now.Before(r.expires) {
		k.mu.Unlock()
		return r.allowed, nil
	}
	k.mu.Unlock()
	extra := map[string]authzv1.ExtraValue{}
	for k, v := range user.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := k.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: user.Username, UID: user.UID, Groups: user.Groups, Extra: extra,
		ResourceAttributes: &authzv1.ResourceAttributes{Group: KubeAuthGroup, Resource: KubeAuthResource, Name: k.node, Verb: verb},
	}}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("subject access review: %w", err)
	}
	ttl := 30 * time.Second
	if sar.Status.Allowed {
		ttl = 5 * time.Minute
	}
	k.mu.Lock()
	prune(k.authz, now, func(r authzResult) time.Time { return r.expires })
	k.authz[key] = authzResult{allowed: sar.Status.Allowed, expires: now.Add(ttl)}
	k.mu.Unlock()
	return sar.Status.Allowed, nil
}

// maxCached bounds each cache, so that callers presenting endless distinct
// tokens cannot grow the daemon's memory.
const maxCached = 4096

// prune drops expired entries once a cache is full, and everything if that
// is not enough. Called with k.mu held.
func prune[K comparable, V any](m map[K]V, now time.Time, expires func(V) time.Time) {
	if len(m) < maxCached {
		return
	}
	for k, v := range m {
		if !now.Before(expires(v)) {
			delete(m, k)
		}
	}
	if len(m) >= maxCached {
		clear(m)
	}
}
