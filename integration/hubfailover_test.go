package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/datum-cloud/galactic-node/hubctl"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/syncbuf"
)

// Leadership of the built galactic-hubctl, two replicas against a real API
// server (issue 32, part B). What each replica wrote is read from the API
// server's audit log, where the replica's --id is in its user agent.

// The replicas' lease timing and client rate. The lease timing is the
// command's default, so that the failover measured is the one shipped: a
// follower polls the Lease every retry period to 2.2 times it (client-go's
// jitter), from the end of its last poll, so it takes the Lease between
// the lease duration and that plus 4.4 retry periods after the leader's
// last renewal, and the issue bounds the failover at the lease duration
// plus 2 s (hubctl.DefaultLeaseTiming says why its retry period is 300 ms,
// not kube-controller-manager's 2 s). The client rate keeps the
// batch of releases in flight for tens of seconds. The burst lets a
// replica that has been idle, the follower taking over, start at once, as
// the command's default burst (100) does: at a burst of 5, the new leader's
// first release waited up to 2.5 s on its own rate limiter, behind the
// startup sweep's 16 concurrent requests.
// failoverLease and failoverRetry are the command's defaults, which the
// replicas run with.
var failoverLease, failoverRetry = hubctl.DefaultLeaseTiming.Duration, hubctl.DefaultLeaseTiming.RetryPeriod

const (
	failoverQPS   = "5"
	failoverBurst = "40"
	// goneClaims are the bound Retain claims of gone networks the leader
	// is releasing when it is killed or stopped; liveNetworks' claims must
	// never be released.
	goneClaims   = 150
	liveNetworks = 10
	// releasedBeforeFault: the fault comes once the leader has released
	// this many claims.
	releasedBeforeFault = 10
)

// TestHubFailoverLeaderSIGKILL: the leader is killed in the middle of a
// batch of releases. The other replica's first release comes within the
// lease duration plus 2 s of the kill; no claim is released twice, none of
// a live network, and every gone network's claim is released in the end.
func TestHubFailoverLeaderSIGKILL(t *testing.T) {
	s := newFailoverScene(t)
	a, b := s.startPair()
	s.awaitReleases(a, releasedBeforeFault)

	kill := time.Now()
	a.signal(syscall.SIGKILL)
	a.awaitExit(time.Minute)
	releasedByA := len(s.audit().releases(a.id))
	if releasedByA >= goneClaims {
		t.Fatalf("the leader released all %d claims before it was killed: no batch in flight; lower the client rate", goneClaims)
	}
	s.awaitAllReleased()
	if v := b.leaderGauge(); v != 1 {
		t.Errorf("the new leader's galactic_hub_leader = %v, want 1", v)
	}

	log := s.audit()
	takeover, ok := log.leaseTaken(b.id, kill)
	first, released := log.firstRelease(b.id, kill)
	if !ok || !released {
		t.Fatalf("no lease take-over (%v) or release (%v) by %s after the kill", ok, released, b.id)
	}
	failover := first.Sub(kill)
	t.Logf("SIGKILL of the leader after %d of %d releases: lease taken %.2f s and first release %.2f s after the kill (lease %s, retry %s; bound %s)",
		releasedByA, goneClaims, takeover.Sub(kill).Seconds(), failover.Seconds(), failoverLease, failoverRetry, failoverLease+2*time.Second)
	if failover > failoverLease+2*time.Second {
		t.Errorf("the new leader's first release came %s after the kill, want at most the lease duration plus 2 s (%s)",
			failover.Round(time.Millisecond), failoverLease+2*time.Second)
	}
	s.checkReleases(log)
}

// TestHubFailoverLeaderSIGSTOPPastItsLease: the leader is stopped in the
// middle of a batch for longer than its lease; the other replica takes the
// Lease and releases; the old leader resumed must write nothing: its
// releases are fenced (LeaseFence). It then exits, or follows.
//
// Its writes are read from the audit log: none to ipclaims, ipallocations
// or networkfabricidentities may have been received after the other
// replica took the Lease (which is after the stop by about the lease
// duration). Between the stop and the take-over, the only ones the API
// server can receive are requests already sent when the process stopped,
// which are logged; everything it sent after it resumed comes after the
// take-over.
func TestHubFailoverLeaderSIGSTOPPastItsLease(t *testing.T) {
	s := newFailoverScene(t)
	a, b := s.startPair()
	s.awaitReleases(a, releasedBeforeFault)

	a.signal(syscall.SIGSTOP)
	a.awaitState('T')
	stopped := time.Now()
	s.await("the other replica to take the Lease", 2*time.Minute, func() (bool, string) {
		h := s.holder()
		return h == b.id, "holder " + h
	})
	s.await("the new leader to release claims", 2*time.Minute, func() (bool, string) {
		n := len(s.audit().releasesAfter(b.id, stopped))
		return n >= 5, fmt.Sprintf("%d released", n)
	})
	// Stopped for the lease and a few seconds more at least.
	time.Sleep(time.Until(stopped.Add(failoverLease + 3*time.Second)))
	resumed := time.Now()
	a.signal(syscall.SIGCONT)
	s.await("the old leader to exit or follow", 2*time.Minute, func() (bool, string) {
		if a.hasExited() {
			return true, ""
		}
		v := a.leaderGauge()
		return v == 0, fmt.Sprintf("galactic_hub_leader %v", v)
	})
	s.awaitAllReleased()
	if v := b.leaderGauge(); v != 1 {
		t.Errorf("the new leader's galactic_hub_leader = %v, want 1", v)
	}

	log := s.audit()
	takeover, ok := log.leaseTaken(b.id, stopped)
	if !ok {
		t.Fatalf("no lease take-over by %s after the stop in the audit log", b.id)
	}
	first, _ := log.firstRelease(b.id, stopped)
	t.Logf("SIGSTOP of the leader for %.1f s: lease taken %.2f s and first release %.2f s after the stop; old leader: %s",
		resumed.Sub(stopped).Seconds(), takeover.Sub(stopped).Seconds(), first.Sub(stopped).Seconds(), a.outcome())
	for _, w := range log.writes(a.id) {
		switch at := w.RequestReceivedTimestamp; {
		case !at.Before(takeover):
			when := "while stopped, after the take-over"
			if !at.Before(resumed) {
				when = fmt.Sprintf("%.3f s after it resumed", at.Sub(resumed).Seconds())
			}
			t.Errorf("the deposed leader wrote %s: %s %s %s/%s -> %d", when, w.Verb, w.ObjectRef.Resource, w.ObjectRef.Namespace, w.ObjectRef.Name, w.ResponseStatus.Code)
		case at.After(stopped):
			t.Logf("in flight when the leader stopped, received %.3f s after: %s %s %s -> %d",
				at.Sub(stopped).Seconds(), w.Verb, w.ObjectRef.Resource, w.ObjectRef.Name, w.ResponseStatus.Code)
		}
	}
	s.checkReleases(log)
}

// failoverScene is an API server of its own, with an audit log of writes
// to claims, allocations, fabric identities and Leases; a platform
// namespace holding bound Retain claims of gone networks and of live ones;
// the address service stand-in finalizing deleted claims; and the built
// hubctl, started as replicas.
type failoverScene struct {
	t          *testing.T
	dyn        dynamic.Interface
	cs         kubernetes.Interface
	auditLog   string
	kubeconfig string
	platform   string
	gone, live []string // claim names
	liveNets   []string // namespace/name of the live networks
	finalized  *finalizations
}

const (
	auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
    resources:
      - group: ipam.miloapis.com
        resources: [ipclaims, ipclaims/*, ipallocations, ipallocations/*]
      - group: cloud.datumapis.com
        resources: [networkfabricidentities]
      - group: coordination.k8s.io
        resources: [leases]
  - level: None
`
	standInFinalizer = "ipam.miloapis.com/allocation"
	standInAgent     = "address-service-stand-in"
)

func newFailoverScene(t *testing.T) *failoverScene {
	t.Helper()
	dir := t.TempDir()
	s := &failoverScene{t: t, auditLog: filepath.Join(dir, "audit.log"), platform: "platform", finalized: &finalizations{}}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	cluster := clustertest.StartWith(t, func(api *envtest.APIServer) {
		api.Configure().Set("audit-policy-file", policy).Set("audit-log-path", s.auditLog)
	})
	t.Cleanup(func() { _ = cluster.Env.Stop() })
	cfg := rest.CopyConfig(cluster.Config)
	cfg.QPS, cfg.Burst, cfg.UserAgent = 500, 1000, "failover-test"
	var err error
	if s.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if s.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	s.kubeconfig = writeKubeconfig(t, cluster.Config)
	s.seed()

	standIn := rest.CopyConfig(cfg)
	standIn.UserAgent = standInAgent
	dyn, err := dynamic.NewForConfig(standIn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.finalize(ctx, dyn)
	}()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// seed creates the claims: each bound, with its Retain allocation and its
// network's fabric identity, as the hub leaves them; the gone ones' networks
// do not exist, the live ones' do.
func (s *failoverScene) seed() {
	t := s.t
	ctx := context.Background()
	for _, ns := range []string{s.platform, "gone", "live"} {
		if _, err := s.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	type network struct {
		ns, name string
		n        int
	}
	var nets []network
	for i := range goneClaims {
		nets = append(nets, network{"gone", fmt.Sprintf("net-%d", i), i + 1})
		s.gone = append(s.gone, hubctl.ClaimName("gone", fmt.Sprintf("net-%d", i)))
	}
	for i := range liveNetworks {
		nets = append(nets, network{"live", fmt.Sprintf("net-%d", i), goneClaims + i + 1})
		s.live = append(s.live, hubctl.ClaimName("live", fmt.Sprintf("net-%d", i)))
		s.liveNets = append(s.liveNets, "live/"+fmt.Sprintf("net-%d", i))
	}
	errs := make(chan error, len(nets))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, n := range nets {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := s.seedOne(ctx, n.ns, n.name, n.n, n.ns == "live"); err != nil {
				errs <- fmt.Errorf("seed %s/%s: %w", n.ns, n.name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func (s *failoverScene) seedOne(ctx context.Context, ns, name string, n int, live bool) error {
	claim := hubctl.ClaimName(ns, name)
	alloc := hubctl.AllocationName(s.platform, claim)
	block := fmt.Sprintf("fd00:0:%x:%x::/64", n>>16, n&0xffff)
	if live {
		if _, err := s.dyn.Resource(hubctl.NetworkResource).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "networking.datumapis.com/v1alpha", "kind": "Network",
			"metadata": map[string]any{"namespace": ns, "name": name}, "spec": map[string]any{},
		}}, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	create := func(gvr schema.GroupVersionResource, ns string, obj map[string]any, status map[string]any) error {
		ri := s.dyn.Resource(gvr).Namespace(ns)
		created, err := ri.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
		if err != nil || status == nil {
			return err
		}
		created.Object["status"] = status
		_, err = ri.UpdateStatus(ctx, created, metav1.UpdateOptions{})
		return err
	}
	if err := create(hubctl.AllocationResource, s.platform, map[string]any{
		"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPAllocation",
		"metadata": map[string]any{"namespace": s.platform, "name": alloc},
		"spec":     map[string]any{"claimRef": map[string]any{"name": claim}, "reclaimPolicy": hubctl.PolicyRetain},
	}, map[string]any{"phase": "Bound", "allocatedCIDR": block}); err != nil {
		return err
	}
	if err := create(hubctl.ClaimResource, s.platform, map[string]any{
		"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPClaim",
		"metadata": map[string]any{"namespace": s.platform, "name": claim, "finalizers": []any{standInFinalizer},
			"annotations": map[string]any{hubctl.AnnotationNetworkNamespace: ns, hubctl.AnnotationNetworkName: name}},
		"spec": map[string]any{"ipFamily": "IPv6", "prefixLength": int64(64), "reclaimPolicy": hubctl.PolicyRetain},
	}, map[string]any{"phase": "Bound", "allocatedCIDR": block, "boundAllocationRef": map[string]any{"name": alloc}}); err != nil {
		return err
	}
	return create(hubctl.FabricIdentityResource, ns, map[string]any{
		"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity",
		"metadata": map[string]any{"namespace": ns, "name": name},
		"spec":     map[string]any{"identity": int64(n), "networkRef": map[string]any{"name": name}},
	}, nil)
}

// finalization is a deleted claim the stand-in finalized.
type finalization struct {
	claim          string
	networkExisted bool
}

type finalizations struct {
	mu   sync.Mutex
	list []finalization
}

func (f *finalizations) add(c finalization) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, c)
}

func (f *finalizations) all() []finalization {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]finalization(nil), f.list...)
}

// finalize is the address service's part in a release, as the stand-in of
// hubctl/cluster_test.go plays it: a deleted claim's Retain allocation
// keeps its block with claimRef cleared, then the claim's finalizer goes.
// It records each claim it finalized, and whether its network existed then.
func (s *failoverScene) finalize(ctx context.Context, dyn dynamic.Interface) {
	claims := dyn.Resource(hubctl.ClaimResource).Namespace(s.platform)
	allocs := dyn.Resource(hubctl.AllocationResource).Namespace(s.platform)
	networks := dyn.Resource(hubctl.NetworkResource)
	step := func() error {
		list, err := claims.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for i := range list.Items {
			c := &list.Items[i]
			if c.GetDeletionTimestamp() == nil || len(c.GetFinalizers()) == 0 {
				continue
			}
			alloc, err := allocs.Get(ctx, hubctl.AllocationName(s.platform, c.GetName()), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if _, ok, _ := unstructured.NestedMap(alloc.Object, "spec", "claimRef"); ok {
				unstructured.RemoveNestedField(alloc.Object, "spec", "claimRef")
				if _, err := allocs.Update(ctx, alloc, metav1.UpdateOptions{}); err != nil {
					return err
				}
			}
			ann := c.GetAnnotations()
			_, err = networks.Namespace(ann[hubctl.AnnotationNetworkNamespace]).Get(ctx, ann[hubctl.AnnotationNetworkName], metav1.GetOptions{})
			existed := err == nil
			c.SetFinalizers(nil)
			if _, err := claims.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
				return err
			}
			s.finalized.add(finalization{claim: c.GetName(), networkExisted: existed})
		}
		return nil
	}
	for {
		if err := step(); err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			s.t.Logf("address service stand-in: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// replica is one galactic-hubctl process.
type replica struct {
	t      *testing.T
	id     string
	cmd    *exec.Cmd
	log    *syncbuf.Buffer
	addr   chan string
	metr   string // its /metrics and /readyz address
	exited chan struct{}
	err    error // of Wait, once exited
}

// start runs the built binary as replica id.
func (s *failoverScene) start(id string) *replica {
	t := s.t
	t.Helper()
	r := &replica{t: t, id: id, log: &syncbuf.Buffer{}, addr: make(chan string, 1), exited: make(chan struct{})}
	r.cmd = exec.Command(hubctlBin(t), "--kubeconfig", s.kubeconfig, "--platform-namespace", s.platform, "--id", id,
		"--listen", "127.0.0.1:0", "--log-format", "json", "--workers", "4",
		"--kube-api-qps", failoverQPS, "--kube-api-burst", failoverBurst) // the default lease timing
	r.cmd.Env = cleanEnv()
	stderr, err := r.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stdout = r.log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = r.log.Write(append(line, '\n'))
			var m struct{ Msg, Address string }
			if json.Unmarshal(line, &m) == nil && m.Msg == "serving metrics and health" {
				r.addr <- m.Address
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		r.err = r.cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() {
		if !r.hasExited() {
			_ = r.cmd.Process.Signal(syscall.SIGCONT)
			_ = r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.exited:
			case <-time.After(time.Minute):
				_ = r.cmd.Process.Kill()
				<-r.exited
			}
		}
		if t.Failed() {
			t.Logf("replica %s log (last 60 lines):\n%s", id, tail(r.log.String(), 60))
		}
	})
	select {
	case r.metr = <-r.addr:
	case <-r.exited:
		t.Fatalf("replica %s exited at start: %v\n%s", id, r.err, r.log.String())
	case <-time.After(time.Minute):
		t.Fatalf("replica %s never served its metrics:\n%s", id, r.log.String())
	}
	return r
}

// startPair starts replica a, waits until it leads, then replica b, and
// waits until b's caches have synced (it is ready to take over) while it
// follows.
func (s *failoverScene) startPair() (a, b *replica) {
	a = s.start("hub-a")
	s.await("hub-a to lead", 2*time.Minute, func() (bool, string) {
		h := s.holder()
		return h == a.id && a.leaderGauge() == 1, "holder " + h
	})
	b = s.start("hub-b")
	s.await("hub-b ready", 2*time.Minute, func() (bool, string) {
		code := b.get("/readyz")
		return code == http.StatusOK, fmt.Sprintf("/readyz %d", code)
	})
	if v := b.leaderGauge(); v != 0 {
		s.t.Fatalf("the follower's galactic_hub_leader = %v, want 0", v)
	}
	return a, b
}

func (r *replica) signal(sig syscall.Signal) {
	r.t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		r.t.Fatalf("%s to %s: %v", sig, r.id, err)
	}
}

func (r *replica) hasExited() bool {
	select {
	case <-r.exited:
		return true
	default:
		return false
	}
}

func (r *replica) awaitExit(limit time.Duration) {
	r.t.Helper()
	select {
	case <-r.exited:
	case <-time.After(limit):
		r.t.Fatalf("%s did not exit", r.id)
	}
}

// awaitState waits until the kernel reports the process in state (T:
// stopped): a signal is delivered asynchronously.
func (r *replica) awaitState(state byte) {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.cmd.Process.Pid))
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(stat, ')'); err == nil && i >= 0 && i+2 < len(stat) && stat[i+2] == state {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s never reached state %c: %s %v", r.id, state, stat, err)
		}
		time.Sleep(time.Millisecond)
	}
}

func (r *replica) outcome() string {
	if r.hasExited() {
		return fmt.Sprintf("exited (%v)", r.err)
	}
	return fmt.Sprintf("running, galactic_hub_leader %v", r.leaderGauge())
}

func (r *replica) get(path string) int {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + r.metr + path)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// leaderGauge scrapes galactic_hub_leader; -1 when it cannot.
func (r *replica) leaderGauge() float64 {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + r.metr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, "galactic_hub_leader "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// holder is the Lease's holder, as the API server has it.
func (s *failoverScene) holder() string {
	l, err := s.cs.CoordinationV1().Leases(s.platform).Get(context.Background(), "galactic-hubctl", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// await polls cond until it holds, failing the test with what and cond's
// last word after limit: generous, for a loaded machine.
func (s *failoverScene) await(what string, limit time.Duration, cond func() (bool, string)) {
	s.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: not in %s; last: %s", what, limit, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (s *failoverScene) awaitReleases(r *replica, n int) {
	s.t.Helper()
	s.await(fmt.Sprintf("%s to release %d claims", r.id, n), 2*time.Minute, func() (bool, string) {
		got := len(s.audit().releases(r.id))
		return got >= n, fmt.Sprintf("%d released", got)
	})
}

// awaitAllReleased waits until no claim of a gone network is left.
func (s *failoverScene) awaitAllReleased() {
	s.t.Helper()
	gone := map[string]bool{}
	for _, c := range s.gone {
		gone[c] = true
	}
	s.await("every gone network's claim released", 10*time.Minute, func() (bool, string) {
		list, err := s.dyn.Resource(hubctl.ClaimResource).Namespace(s.platform).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		left := 0
		for _, c := range list.Items {
			if gone[c.GetName()] {
				left++
			}
		}
		return left == 0, fmt.Sprintf("%d left", left)
	})
}

// checkReleases: no claim released twice, none of a live network, and the
// live networks' claims and identities still there; the stand-in finalized
// each gone claim once, with its network gone.
func (s *failoverScene) checkReleases(log auditLog) {
	t := s.t
	t.Helper()
	live := map[string]bool{}
	for _, c := range s.live {
		live[c] = true
	}
	deletes := map[string]int{}
	for _, e := range log {
		if e.successful() && e.Verb == "delete" && e.ObjectRef.Resource == "ipclaims" && e.ObjectRef.Subresource == "" {
			deletes[e.ObjectRef.Name]++
		}
	}
	for c, n := range deletes {
		if n > 1 {
			t.Errorf("claim %s deleted %d times", c, n)
		}
		if live[c] {
			t.Errorf("claim %s of a live network deleted", c)
		}
	}
	for _, e := range log {
		if e.successful() && e.Verb == "delete" && e.ObjectRef.Resource == "networkfabricidentities" && e.ObjectRef.Namespace == "live" {
			t.Errorf("fabric identity of live network %s deleted", e.ObjectRef.Name)
		}
	}
	for i, c := range s.live {
		if _, err := s.dyn.Resource(hubctl.ClaimResource).Namespace(s.platform).Get(context.Background(), c, metav1.GetOptions{}); err != nil {
			t.Errorf("live network %s's claim: %v", s.liveNets[i], err)
		}
	}
	finalized := map[string]int{}
	for _, f := range s.finalized.all() {
		finalized[f.claim]++
		if f.networkExisted {
			t.Errorf("the address service finalized claim %s while its network existed", f.claim)
		}
	}
	for _, c := range s.gone {
		if finalized[c] != 1 {
			t.Errorf("the address service finalized claim %s %d times, want once", c, finalized[c])
		}
	}
}

// auditEvent is what the tests read of the API server's audit events.
type auditEvent struct {
	Stage     string `json:"stage"`
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	ObjectRef struct {
		Resource, Namespace, Name, Subresource string
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
	StageTimestamp           time.Time `json:"stageTimestamp"`
}

func (e auditEvent) successful() bool {
	return e.ResponseStatus.Code >= 200 && e.ResponseStatus.Code < 300
}

// by tells whether replica id made the request: its --id is in the user
// agent, "galactic-hubctl/<version> (<id>)".
func (e auditEvent) by(id string) bool {
	return strings.HasPrefix(e.UserAgent, "galactic-hubctl/") && strings.HasSuffix(e.UserAgent, "("+id+")")
}

// auditLog is the log's completed requests, in the order received.
type auditLog []auditEvent

func (s *failoverScene) audit() auditLog {
	s.t.Helper()
	data, err := os.ReadFile(s.auditLog)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		s.t.Fatal(err)
	}
	var log auditLog
	for _, line := range bytes.Split(data, []byte("\n")) {
		var e auditEvent
		if len(line) == 0 || json.Unmarshal(line, &e) != nil || e.Stage != "ResponseComplete" {
			continue // the last line may be still being written
		}
		log = append(log, e)
	}
	sort.SliceStable(log, func(i, j int) bool { return log[i].RequestReceivedTimestamp.Before(log[j].RequestReceivedTimestamp) })
	return log
}

// releases are id's successful claim deletes.
func (l auditLog) releases(id string) []auditEvent { return l.releasesAfter(id, time.Time{}) }

func (l auditLog) releasesAfter(id string, after time.Time) []auditEvent {
	var out []auditEvent
	for _, e := range l {
		if e.by(id) && e.successful() && e.Verb == "delete" && e.ObjectRef.Resource == "ipclaims" && e.RequestReceivedTimestamp.After(after) {
			out = append(out, e)
		}
	}
	return out
}

// firstRelease is when id's first successful claim delete after after
// completed.
func (l auditLog) firstRelease(id string, after time.Time) (time.Time, bool) {
	r := l.releasesAfter(id, after)
	if len(r) == 0 {
		return time.Time{}, false
	}
	first := r[0].StageTimestamp
	for _, e := range r {
		if e.StageTimestamp.Before(first) {
			first = e.StageTimestamp
		}
	}
	return first, true
}

// leaseTaken is when id's first successful write of the Lease after after
// completed: a follower writes the Lease only to take it.
func (l auditLog) leaseTaken(id string, after time.Time) (time.Time, bool) {
	for _, e := range l {
		if e.by(id) && e.successful() && e.ObjectRef.Resource == "leases" && e.RequestReceivedTimestamp.After(after) {
			return e.StageTimestamp, true
		}
	}
	return time.Time{}, false
}

// writes are id's requests that write claims, allocations or fabric
// identities, whatever their outcome.
func (l auditLog) writes(id string) []auditEvent {
	var out []auditEvent
	for _, e := range l {
		switch e.ObjectRef.Resource {
		case "ipclaims", "ipallocations", "networkfabricidentities":
			if e.by(id) {
				out = append(out, e)
			}
		}
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
