package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/datum-cloud/galactic-node/hubctl"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/ipamtest"
)

// The address-service models a scene runs against.
const (
	modelCRD  = "crd"  // the real API server directly, the stand-in binding claims
	modelIpam = "ipam" // the ipam-shaped proxy in front of it (test/framework/ipamtest)
)

// The scene's shape: the platform's namespace and project, the tenants'
// namespaces, the names that churn, the names whose claim an operator made
// with reclaimPolicy Delete before their network came (the hub keeps such
// a claim when the network goes: rule 2), the steady networks, and the
// quota, below what the names would hold, so that it is often at its
// limit.
const (
	platform   = "platform"
	churnNames = 5
	quota      = 10
	lease      = "galactic-hubctl"
)

var (
	tenants   = []string{"team-a", "team-b"}
	keepNames = []string{"team-a/keep-0", "team-b/keep-1"}
	// steadyNames are created, and claimed, before the random phase and
	// never deleted: no read can find them gone, so no deletion of their
	// identities is ever excused. A hub that releases live networks' claims
	// (direct-read-off) takes theirs at the first failover's sweep, however
	// the churn fell; they hold two units of the quota throughout, which
	// is why the quota is two above the churn's.
	steadyNames = []string{"team-a/steady-0", "team-b/steady-1"}
)

// sceneConfig is one run.
type sceneConfig struct {
	model  string
	binary string
	// variant is GALACTICTEST_HUB_BREAK for the replicas ("": none).
	variant string
	seed    uint64
	// random is how long the random work and faults go on; settle bounds
	// the wait for the hub to settle after.
	random, settle time.Duration
	// stopEarly ends the run at the first violation the history shows.
	stopEarly bool
}

// sceneResult is what a run leaves.
type sceneResult struct {
	violations []Violation
	dir        string // the history and the replicas' logs
	took       time.Duration
	// randomStart is when the random phase began.
	randomStart time.Time
}

// scene is one run's parts.
type scene struct {
	cfg     sceneConfig
	log     *slog.Logger
	cluster *clustertest.Cluster
	admin   dynamic.Interface // the real API server
	cs      kubernetes.Interface
	// claimWriter writes claims as an operator would: through the address
	// service.
	claimWriter dynamic.Interface
	svc         *ipamtest.Service
	hubConfig   *rest.Config
	hist        *History
	audit       *auditTail
	dir         string
	replicas    []*replica
	names       []string // "namespace/name", churn and keep
}

// runScene runs one scene and checks its history. Setup failures are
// returned: the caller fails, naming the seed.
func runScene(t *testing.T, cfg sceneConfig) (sceneResult, error) {
	start := time.Now()
	s := &scene{cfg: cfg, dir: t.TempDir(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if os.Getenv("GALACTICTEST_HUB_LOG") != "" {
		s.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("scene", cfg.model+"/"+cfg.variant)
	}
	res := sceneResult{dir: s.dir}
	hist, err := NewHistory(filepath.Join(s.dir, "history.jsonl"))
	if err != nil {
		return res, err
	}
	s.hist = hist
	defer func() { _ = hist.Close() }()
	hist.Add(Event{Kind: KindPhase, What: "setup", Detail: fmt.Sprintf("model %s, variant %q, seed %d, random %s", cfg.model, cfg.variant, cfg.seed, cfg.random)})

	configure, auditLog, err := withAudit(s.dir)
	if err != nil {
		return res, fmt.Errorf("audit policy: %w", err)
	}
	s.cluster = clustertest.StartWith(t, configure)
	defer func() { _ = s.cluster.Env.Stop() }()
	if err := s.setup(t); err != nil {
		return res, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var background sync.WaitGroup
	defer func() { cancel(); background.Wait() }()
	s.audit = newAuditTail(auditLog, hist)
	defer s.audit.close()
	s.audit.poll()
	background.Go(func() { s.audit.run(ctx) })
	for _, o := range []string{ObjectNetwork, ObjectIdentity, ObjectClaim} {
		w, err := s.startWatch(ctx, o)
		if err != nil {
			return res, err
		}
		background.Go(func() { w.run(ctx) })
	}
	if cfg.model == modelCRD {
		st := &standIn{dyn: s.admin, cs: s.cs, ns: platform, log: s.log}
		background.Go(func() { st.run(ctx) })
	}
	if err := s.keepClaims(ctx); err != nil {
		return res, err
	}
	if err := s.startReplicas(ctx, &background); err != nil {
		return res, err
	}
	if err := s.awaitLeader(ctx, time.Minute); err != nil {
		return res, err
	}
	if err := s.steady(ctx, time.Minute); err != nil {
		return res, err
	}

	res.randomStart = time.Now()
	caught := s.randomPhase(ctx)
	if !caught {
		s.settle(ctx)
	}
	cancel()
	background.Wait()
	// What the API server answered before the end, read to the end.
	s.audit.poll()
	if err := hist.Flush(); err != nil {
		return res, err
	}
	res.violations = Check(hist.Events())
	res.took = time.Since(start)
	return res, nil
}

// setup makes the namespaces and the quota, and, for ipam, the proxy.
func (s *scene) setup(t *testing.T) error {
	ctx := context.Background()
	var err error
	cfg := rest.CopyConfig(s.cluster.Config)
	cfg.QPS, cfg.Burst = 200, 400
	if s.admin, err = dynamic.NewForConfig(cfg); err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	if s.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("admin clientset: %w", err)
	}
	for _, ns := range append([]string{platform}, tenants...) {
		if _, err := s.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	for _, ns := range tenants {
		for i := range churnNames {
			s.names = append(s.names, fmt.Sprintf("%s/net-%d", ns, i))
		}
	}
	s.names = append(s.names, keepNames...)
	switch s.cfg.model {
	case modelCRD:
		if _, err := s.cs.CoreV1().ResourceQuotas(platform).Create(ctx, &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Name: "claims"},
			Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{quotaResource: resource.MustParse(fmt.Sprint(quota))}},
		}, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create quota: %w", err)
		}
		s.hubConfig, s.claimWriter = s.cluster.Config, s.admin
	case modelIpam:
		// Milo gives a unit back some time after the claim went.
		s.svc = ipamtest.Start(t, s.cluster.Config, ipamtest.Options{Project: platform, QuotaLimit: quota, QuotaReturnDelay: time.Second})
		s.hubConfig = s.svc.Config(platform)
		if s.claimWriter, err = dynamic.NewForConfig(s.hubConfig); err != nil {
			return fmt.Errorf("client of the address service: %w", err)
		}
	default:
		return fmt.Errorf("unknown model %q", s.cfg.model)
	}
	return nil
}

// keepClaims makes, as an operator would, the claims of the keep names
// with reclaimPolicy Delete, before their networks exist: the hub takes
// such a claim's block when the network comes, and keeps the claim when it
// goes.
func (s *scene) keepClaims(ctx context.Context) error {
	for _, n := range keepNames {
		ns, name, _ := strings.Cut(n, "/")
		claim := hubctl.ClaimName(ns, name)
		_, err := s.claimWriter.Resource(hubctl.ClaimResource).Namespace(platform).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPClaim",
			"metadata": map[string]any{"namespace": platform, "name": claim, "annotations": map[string]any{
				hubctl.AnnotationNetworkNamespace: ns, hubctl.AnnotationNetworkName: name}},
			"spec": map[string]any{"ipFamily": "IPv6", "prefixLength": int64(64), "reclaimPolicy": hubctl.PolicyDelete},
		}}, metav1.CreateOptions{})
		s.hist.Add(Event{Kind: KindOp, What: "claim", Network: n, Claim: claim, Detail: "reclaimPolicy Delete, by an operator", Err: errString(err)})
		if err != nil {
			return fmt.Errorf("make the kept claim of %s: %w", n, err)
		}
	}
	return nil
}

func (s *scene) startReplicas(ctx context.Context, wg *sync.WaitGroup) error {
	kubeconfig, err := writeKubeconfig(s.hubConfig, filepath.Join(s.dir, "kubeconfig"))
	if err != nil {
		return err
	}
	env := replicaEnv(s.cfg.variant)
	for _, id := range []string{"hub-a", "hub-b"} {
		r := newReplica(id, s.cfg.binary, kubeconfig, platform, s.dir, env, s.hist)
		s.replicas = append(s.replicas, r)
		wg.Go(func() { r.run(ctx) })
	}
	return nil
}

// holder is the Lease's holder, "" when none or unreadable.
func (s *scene) holder(ctx context.Context) string {
	l, err := s.cs.CoordinationV1().Leases(platform).Get(ctx, lease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func (s *scene) replica(id string) *replica {
	for _, r := range s.replicas {
		if r.id == id {
			return r
		}
	}
	return nil
}

func (s *scene) awaitLeader(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for s.replica(s.holder(ctx)) == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("no replica took the Lease in %s (logs in %s)", limit, s.dir)
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.hist.Add(Event{Kind: KindNote, What: "leader", Replica: s.holder(ctx)})
	return nil
}

// steady creates the steady networks and waits, up to limit, until the
// hub has written an identity for each.
func (s *scene) steady(ctx context.Context, limit time.Duration) error {
	for _, n := range steadyNames {
		s.createNetwork(ctx, n)
	}
	deadline := time.Now().Add(limit)
	for {
		have := map[string]bool{}
		for _, e := range s.hist.Events() {
			if e.Kind == KindObserve && e.Object == ObjectIdentity && e.What == "added" {
				have[e.Network] = true
			}
		}
		missing := ""
		for _, n := range steadyNames {
			if !have[n] {
				missing = n
			}
		}
		if missing == "" {
			s.hist.Add(Event{Kind: KindNote, What: "steady networks claimed"})
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("steady network %s had no identity after %s (logs in %s)", missing, limit, s.dir)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// randomPhase runs the work and the faults for the configured time, or,
// with stopEarly, until the history shows a violation; it reports whether
// it stopped on one. Every stopped replica is resumed before it returns.
func (s *scene) randomPhase(ctx context.Context) bool {
	s.hist.Add(Event{Kind: KindPhase, What: "start"})
	rctx, stop := context.WithTimeout(ctx, s.cfg.random)
	defer stop()
	var wg sync.WaitGroup
	// Each loop draws from a source of its own, so that what one draws does
	// not depend on how the other was scheduled.
	wg.Go(func() { s.work(rctx, rand.New(rand.NewPCG(s.cfg.seed, 1))) })
	wg.Go(func() { s.faults(rctx, rand.New(rand.NewPCG(s.cfg.seed, 2))) })
	caught := false
	if s.cfg.stopEarly {
		wg.Go(func() {
			for rctx.Err() == nil {
				select {
				case <-rctx.Done():
				case <-time.After(time.Second):
				}
				// A deletion the watches delivered this recently may not
				// have its network's deletion beside it yet; one the audit
				// log was last read before may lack the read that excuses
				// it (that read was answered before the delete was sent).
				judged := time.Now().Add(-2 * time.Second)
				if c := s.audit.caughtUp(); c.Before(judged) {
					judged = c
				}
				if vs := CheckSoFar(s.hist.Events(), judged); len(vs) > 0 {
					caught = true
					s.hist.Add(Event{Kind: KindNote, What: "stopped at the first violation", Detail: vs[0].String()})
					stop()
				}
			}
		})
	}
	wg.Wait()
	for _, r := range s.replicas {
		r.resume()
	}
	s.hist.Add(Event{Kind: KindPhase, What: "faults-stop"})
	return caught
}

// work creates, deletes and re-creates networks at random, a few every
// second, until ctx ends.
func (s *scene) work(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		n := s.names[rng.IntN(len(s.names))]
		switch r := rng.IntN(100); {
		case r < 45:
			s.createNetwork(ctx, n)
		case r < 75:
			s.deleteNetwork(ctx, n)
		default:
			// Re-created under its name at once: the race of "A network
			// re-created between the read and the deletes" (docs/hub.md).
			s.deleteNetwork(ctx, n)
			s.createNetwork(ctx, n)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(30+rng.IntN(220)) * time.Millisecond):
		}
	}
}

func (s *scene) networks(ns string) dynamic.ResourceInterface {
	return s.admin.Resource(hubctl.NetworkResource).Namespace(ns)
}

func (s *scene) createNetwork(ctx context.Context, n string) {
	ns, name, _ := strings.Cut(n, "/")
	u, err := s.networks(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.datumapis.com/v1alpha", "kind": "Network",
		"metadata": map[string]any{"namespace": ns, "name": name}, "spec": map[string]any{},
	}}, metav1.CreateOptions{})
	e := Event{Kind: KindOp, What: "create", Network: n}
	switch {
	case err == nil:
		e.UID, e.RV = string(u.GetUID()), ParseRV(u.GetResourceVersion())
	case apierrors.IsAlreadyExists(err) || ctx.Err() != nil:
		return // nothing written
	default:
		e.Err = err.Error()
	}
	s.hist.Add(e)
}

func (s *scene) deleteNetwork(ctx context.Context, n string) {
	ns, name, _ := strings.Cut(n, "/")
	err := s.networks(ns).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) || ctx.Err() != nil {
		return
	}
	s.hist.Add(Event{Kind: KindOp, What: "delete", Network: n, Err: errString(err)})
}

// faults, every few seconds, SIGKILL the leader (its pod restarts it) or
// SIGSTOP it for its lease and a second more, then SIGCONT, until ctx ends.
// The first comes early, so that even a short run has a failover.
func (s *scene) faults(ctx context.Context, rng *rand.Rand) {
	next := time.Duration(1500+rng.IntN(2500)) * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(next):
		}
		next = time.Duration(3000+rng.IntN(4000)) * time.Millisecond
		r := s.replica(s.holder(ctx))
		if r == nil {
			s.hist.Add(Event{Kind: KindNote, What: "no leader to fault"})
			continue
		}
		if rng.IntN(2) == 0 {
			if r.signal(syscall.SIGKILL) {
				s.hist.Add(Event{Kind: KindFault, What: "sigkill", Replica: r.id})
			}
			continue
		}
		if !r.signal(syscall.SIGSTOP) {
			continue
		}
		s.hist.Add(Event{Kind: KindFault, What: "sigstop", Replica: r.id})
		select {
		case <-ctx.Done():
		case <-time.After(leaseDuration + time.Second):
		}
		r.resume()
	}
}

// settle waits, up to the configured bound, for a snapshot that a settled
// hub would show (CheckSettled finds nothing), and records the last one.
func (s *scene) settle(ctx context.Context) {
	deadline := time.Now().Add(s.cfg.settle)
	var last *Snapshot
	polls := 0
	for {
		snap, err := s.snapshot(ctx)
		polls++
		if err != nil {
			s.hist.Add(Event{Kind: KindNote, What: "snapshot", Err: err.Error()})
		} else {
			last = snap
			if len(CheckSettled(*snap)) == 0 {
				break
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if last != nil {
		s.hist.Add(Event{Kind: KindSnapshot, What: "end", Snapshot: last, Detail: fmt.Sprintf("after %d looks", polls)})
	}
	s.hist.Add(Event{Kind: KindPhase, What: "settled"})
}

// snapshot reads the end state: networks, identities, claims with their
// allocations' policies, and the quota.
func (s *scene) snapshot(ctx context.Context) (*Snapshot, error) {
	list := func(gvr schema.GroupVersionResource, ns string) ([]unstructured.Unstructured, error) {
		l, err := s.admin.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", gvr.Resource, err)
		}
		return l.Items, nil
	}
	nets, err1 := list(hubctl.NetworkResource, "")
	ids, err2 := list(hubctl.FabricIdentityResource, "")
	claims, err3 := list(hubctl.ClaimResource, platform)
	allocs, err4 := list(hubctl.AllocationResource, platform)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return nil, err
	}
	snap := &Snapshot{Identities: map[string]uint32{}, QuotaLimit: quota, QuotaUsed: len(claims)}
	if s.svc != nil {
		snap.QuotaUsed = s.svc.QuotaUsed()
	}
	for _, n := range nets {
		snap.Networks = append(snap.Networks, n.GetNamespace()+"/"+n.GetName())
	}
	for _, id := range ids {
		fid, _, _ := unstructured.NestedInt64(id.Object, "spec", "identity")
		snap.Identities[id.GetNamespace()+"/"+id.GetName()] = uint32(fid)
	}
	policy := map[string]string{}
	for _, a := range allocs {
		policy[a.GetName()] = nestedString(&a, "spec", "reclaimPolicy")
	}
	for _, c := range claims {
		if !strings.HasPrefix(c.GetName(), hubctl.ClaimPrefix) {
			continue
		}
		e := claimEvent(&c)
		snap.Claims = append(snap.Claims, SnapClaim{Name: c.GetName(), Network: claimNetwork(e), Block: e.Block,
			Policy:   policy[hubctl.AllocationName(platform, c.GetName())],
			Deleting: c.GetDeletionTimestamp() != nil || e.Phase == hubctl.PhaseReleasing})
	}
	return snap, nil
}

// writeKubeconfig writes cfg as a kubeconfig file for the replicas.
func writeKubeconfig(cfg *rest.Config, path string) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["hub"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["hub"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["hub"] = &clientcmdapi.Context{Cluster: "hub", AuthInfo: "hub"}
	kc.CurrentContext = "hub"
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return "", fmt.Errorf("write kubeconfig: %w", err)
	}
	return path, nil
}

// observer records what one watch sees.
type observer struct {
	s      *scene
	object string
	ri     dynamic.ResourceInterface
	rv     string
	gap    bool
}

// startWatch lists the object's kind (nothing yet, in a fresh cluster)
// and returns an observer that watches it from there.
func (s *scene) startWatch(ctx context.Context, object string) (*observer, error) {
	var ri dynamic.ResourceInterface
	switch object {
	case ObjectNetwork:
		ri = s.admin.Resource(hubctl.NetworkResource)
	case ObjectIdentity:
		ri = s.admin.Resource(hubctl.FabricIdentityResource)
	case ObjectClaim:
		ri = s.admin.Resource(hubctl.ClaimResource).Namespace(platform)
	}
	l, err := ri.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list %ss to watch: %w", object, err)
	}
	return &observer{s: s, object: object, ri: ri, rv: l.GetResourceVersion()}, nil
}

// run records every event until ctx ends, watching again from the last
// revision seen when a watch ends; a watch refused as too old lists anew,
// and the events after carry Gap.
func (o *observer) run(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := o.ri.Watch(ctx, metav1.ListOptions{ResourceVersion: o.rv, AllowWatchBookmarks: true})
		if err != nil {
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				o.relist(ctx)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		o.drain(ctx, w)
		w.Stop()
	}
}

func (o *observer) drain(ctx context.Context, w watch.Interface) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.ResultChan():
			if !ok {
				return
			}
			switch ev.Type {
			case watch.Error:
				if st, ok := ev.Object.(*metav1.Status); ok && st.Code == 410 {
					o.relist(ctx)
				}
				return
			case watch.Bookmark:
				if u, ok := ev.Object.(*unstructured.Unstructured); ok {
					o.rv = u.GetResourceVersion()
				}
				continue
			}
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			o.rv = u.GetResourceVersion()
			o.record(ev.Type, u)
		}
	}
}

func (o *observer) relist(ctx context.Context) {
	l, err := o.ri.List(ctx, metav1.ListOptions{})
	if err != nil {
		return
	}
	o.rv, o.gap = l.GetResourceVersion(), true
	o.s.hist.Add(Event{Kind: KindNote, What: "watch gap", Object: o.object, Detail: "listed anew at " + o.rv})
}

func (o *observer) record(t watch.EventType, u *unstructured.Unstructured) {
	e := Event{Kind: KindObserve, Object: o.object, UID: string(u.GetUID()), RV: ParseRV(u.GetResourceVersion()), Gap: o.gap}
	switch t {
	case watch.Added:
		e.What = "added"
	case watch.Modified:
		e.What = "modified"
	case watch.Deleted:
		e.What = "deleted"
	default:
		return
	}
	switch o.object {
	case ObjectNetwork:
		e.Network = u.GetNamespace() + "/" + u.GetName()
	case ObjectIdentity:
		e.Network = u.GetNamespace() + "/" + u.GetName()
		fid, _, _ := unstructured.NestedInt64(u.Object, "spec", "identity")
		e.FabricID = uint32(fid)
	case ObjectClaim:
		c := claimEvent(u)
		e.Claim, e.Network, e.Block, e.Phase = c.Claim, c.Network, c.Block, c.Phase
	}
	o.s.hist.Add(e)
}

// claimEvent reads what the history keeps of a claim.
func claimEvent(u *unstructured.Unstructured) Event {
	ann := u.GetAnnotations()
	e := Event{Claim: u.GetName(), Block: nestedString(u, "status", "allocatedCIDR"), Phase: nestedString(u, "status", "phase")}
	if ns, name := ann[hubctl.AnnotationNetworkNamespace], ann[hubctl.AnnotationNetworkName]; ns != "" && name != "" {
		e.Network = ns + "/" + name
	}
	return e
}
