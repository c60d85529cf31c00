package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/datum-cloud/galactic-node/hubctl"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/ipamtest"
	"github.com/datum-cloud/galactic-node/test/framework/syncbuf"
)

// The built galactic-hubctl against a real kube-apiserver behind the
// ipam-shaped address service (test/framework/ipamtest), as a platform team runs
// it against milo-os/ipam.

type ipamScene struct {
	t        *testing.T
	cluster  *clustertest.Cluster
	dyn      dynamic.Interface
	cs       kubernetes.Interface
	svc      *ipamtest.Service
	platform string
}

const ipamProject = "platform"

func newIpamScene(t *testing.T, opts ipamtest.Options) *ipamScene {
	t.Helper()
	cluster := clustertest.Shared(t)
	cs, err := kubernetes.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	s := &ipamScene{t: t, cluster: cluster, dyn: cluster.Client, cs: cs, platform: fmt.Sprintf("platform-%d", time.Now().UnixNano()%1e9)}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.platform}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	opts.Project = ipamProject
	s.svc = ipamtest.Start(t, cluster.Config, opts)
	return s
}

// hubProc is one run of the built binary.
type hubProc struct {
	log     *syncbuf.Buffer
	metrics string // host:port of /metrics, /readyz, /status
}

// hubRun is a hubProc whose process the test may kill.
type hubRun struct {
	*hubProc
	cmd    *exec.Cmd
	exited chan struct{}
}

// start runs the built binary against the service, scoped to project (""
// for a kubeconfig that reaches the service unscoped).
func (s *ipamScene) start(project string) *hubProc {
	return s.run(project, "ipam-"+project+"-"+s.platform).hubProc
}

// run is start as instance id, with extra flags.
func (s *ipamScene) run(project, id string, extra ...string) *hubRun {
	t := s.t
	t.Helper()
	r := &hubRun{hubProc: &hubProc{log: &syncbuf.Buffer{}}, exited: make(chan struct{})}
	addr := make(chan string, 1)
	args := append([]string{"--kubeconfig", writeKubeconfig(t, s.svc.Config(project)), "--platform-namespace", s.platform,
		"--id", id, "--listen", "127.0.0.1:0", "--log-format", "json", "--workers", "4"}, extra...)
	r.cmd = exec.Command(hubctlBin(t), args...)
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
				addr <- m.Address
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = r.cmd.Wait()
		close(r.exited)
	}()
	t.Cleanup(func() {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(time.Minute):
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
		if t.Failed() {
			t.Logf("galactic-hubctl (--id %s) log:\n%s", id, tail(r.log.String(), 60))
		}
	})
	select {
	case r.metrics = <-addr:
	case <-r.exited:
		t.Fatalf("galactic-hubctl exited:\n%s", r.log.String())
	case <-time.After(time.Minute):
		t.Fatalf("galactic-hubctl did not serve metrics:\n%s", r.log.String())
	}
	return r
}

// kill ends the hub with SIGKILL: no deferred work, no lease released.
func (r *hubRun) kill(t *testing.T) {
	t.Helper()
	_ = r.cmd.Process.Kill()
	select {
	case <-r.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("galactic-hubctl did not exit on SIGKILL")
	}
}

func (p *hubProc) get(path string) (int, string) {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + p.metrics + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (s *ipamScene) await(what string, limit time.Duration, cond func() bool) {
	s.t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			s.t.Fatalf("timed out after %s waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *ipamScene) network(ns, name string) {
	s.cluster.Apply(s.t, hubctl.NetworkResource, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.datumapis.com/v1alpha", "kind": "Network",
		"metadata": map[string]any{"namespace": ns, "name": name}, "spec": map[string]any{},
	}})
}

// liveNetwork creates network ns/name, deleted when the test ends, and
// waits for the hub to give it its fabric identity, which it returns.
func (s *ipamScene) liveNetwork(ns, name string) int64 {
	s.t.Helper()
	s.network(ns, name)
	s.t.Cleanup(func() { s.cluster.Delete(s.t, hubctl.NetworkResource, ns, name) })
	s.await(ns+"/"+name+"'s identity", time.Minute, func() bool { _, ok := s.identity(ns, name); return ok })
	id, _ := s.identity(ns, name)
	return id
}

func (s *ipamScene) identity(ns, name string) (int64, bool) {
	u, err := s.dyn.Resource(hubctl.FabricIdentityResource).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return 0, false
	}
	id, _, _ := unstructured.NestedInt64(u.Object, "spec", "identity")
	return id, true
}

func (s *ipamScene) claim(ns, name string) (*unstructured.Unstructured, error) {
	return s.dyn.Resource(hubctl.ClaimResource).Namespace(s.platform).Get(context.Background(), hubctl.ClaimName(ns, name), metav1.GetOptions{})
}

// The acceptance of issue 47, item 1: a network re-created between the
// hub's read of its claim and its delete, its claim made anew and its
// identity written by another writer (a second hub, an operator), loses
// that claim to the hub's delete, since ipam never reads a delete's
// preconditions (AllocatingREST.Delete). The built hub learns it from the
// UID ipam answers, finds the network living, and claims again at once: it
// ends with a claim bound to its same block, and an event says so.
func TestANetworkRecreatedBetweenTheReadAndTheDeleteEndsWithItsClaimAgainstIpam(t *testing.T) {
	s := newIpamScene(t, ipamtest.Options{Retained: ipamtest.RetainedRebind})
	team := "x-" + s.platform
	hub := s.start(ipamProject)
	id := s.liveNetwork(team, "net-a")
	claimName := hubctl.ClaimName(team, "net-a")

	proxied, err := dynamic.NewForConfig(s.svc.Config(ipamProject))
	if err != nil {
		t.Fatal(err)
	}
	claims := proxied.Resource(hubctl.ClaimResource).Namespace(s.platform)
	// Once: the hook's own delete of the old claim comes through it too.
	var hooked atomic.Bool
	// Written by the proxy's handler, read by the test: atomic.
	var recreated atomic.Value
	recreated.Store("")
	s.svc.SetBeforeClaimDelete(func(_, name string) {
		if name != claimName || !hooked.CompareAndSwap(false, true) {
			return
		}
		func() {
			ctx := context.Background()
			// Another writer, inside the hub's window: the network back,
			// its claim deleted and made anew (ipam re-binds the block),
			// its identity written from it.
			s.network(team, "net-a")
			if err := claims.Delete(ctx, claimName, metav1.DeleteOptions{}); err != nil {
				t.Errorf("delete the old claim: %v", err)
			}
			c, err := claims.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "ipam.miloapis.com/v1alpha1", "kind": "IPClaim",
				"metadata": map[string]any{"namespace": s.platform, "name": claimName, "annotations": map[string]any{
					hubctl.AnnotationNetworkNamespace: team, hubctl.AnnotationNetworkName: "net-a"}},
				"spec": map[string]any{"ipFamily": "IPv6", "prefixLength": int64(64), "reclaimPolicy": "Retain"},
			}}, metav1.CreateOptions{})
			if err != nil {
				t.Errorf("make the claim anew: %v", err)
				return
			}
			recreated.Store(string(c.GetUID()))
			s.cluster.Apply(t, hubctl.FabricIdentityResource, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "cloud.datumapis.com/v1alpha1", "kind": "NetworkFabricIdentity",
				"metadata": map[string]any{"namespace": team, "name": "net-a"},
				"spec":     map[string]any{"identity": id, "networkRef": map[string]any{"name": "net-a"}},
			}})
		}()
	})
	s.cluster.Delete(t, hubctl.NetworkResource, team, "net-a")

	var claim *unstructured.Unstructured
	s.await("the live network's claim bound again", time.Minute, func() bool {
		claim, err = s.claim(team, "net-a")
		if err != nil || recreated.Load() == "" || string(claim.GetUID()) == recreated.Load() {
			return false
		}
		phase, _, _ := unstructured.NestedString(claim.Object, "status", "phase")
		return phase == "Bound"
	})
	cidr, _, _ := unstructured.NestedString(claim.Object, "status", "allocatedCIDR")
	if fid, err := hubctl.FabricIDFromBlock(cidr); err != nil || int64(fid) != id {
		t.Fatalf("the claim made again holds %s (fabric ID %d, %v), want the network's %d", cidr, fid, err, id)
	}
	if got, ok := s.identity(team, "net-a"); !ok || got != id {
		t.Fatalf("identity %d %v, want %d", got, ok, id)
	}
	s.await("the FabricIdentityClaimRestored event", time.Minute, func() bool {
		events, err := s.cs.CoreV1().Events(team).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, e := range events.Items {
			if e.Reason == "FabricIdentityClaimRestored" && e.InvolvedObject.Name == "net-a" {
				return true
			}
		}
		return false
	})
	if _, metrics := hub.get("/metrics"); !strings.Contains(metrics, "galactic_hub_claims_restored_total 1") {
		t.Fatalf("galactic_hub_claims_restored_total is not 1:\n%s", grepLines(metrics, "galactic_hub_claims_restored", 5))
	}
}

// The acceptance of issue 47, item 5: a hub whose kubeconfig does not
// reach the platform project's control plane sees ipam's empty lists, not
// an error. With identities in view and no claim, the built hub is not
// ready and says why; the same hub scoped to the project is ready.
func TestAnUnscopedHubIsNotReadyAgainstIpam(t *testing.T) {
	s := newIpamScene(t, ipamtest.Options{})
	team := "u-" + s.platform
	scoped := s.start(ipamProject)
	s.liveNetwork(team, "net-a")
	s.await("the scoped hub ready", time.Minute, func() bool { code, _ := scoped.get("/readyz"); return code == http.StatusOK })

	unscoped := s.start("")
	s.await("the unscoped hub to say it cannot see its claims", time.Minute, func() bool {
		code, _ := unscoped.get("/readyz")
		_, status := unscoped.get("/status")
		return code == http.StatusServiceUnavailable && strings.Contains(status, `"blind":true`)
	})
	time.Sleep(2 * time.Second)
	if code, body := unscoped.get("/readyz"); code == http.StatusOK {
		t.Fatalf("the unscoped hub became ready: %s", body)
	}
}

// metric is the value of the sample named series (name and labels as
// /metrics prints them) in a scrape, -1 when absent.
func metric(scrape, series string) float64 {
	for _, l := range strings.Split(scrape, "\n") {
		if rest, ok := strings.CutPrefix(l, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v
			}
		}
	}
	return -1
}

func (p *hubProc) metric(series string) float64 {
	_, body := p.get("/metrics")
	return metric(body, series)
}

// The acceptance of issue 47, item 2, through the built binary: a network
// name that returns keeps its block in each form the service answers: the
// 201 that re-binds it (ipam a41cd6f1), the plain 409 (012be054), the 409
// with cause (the seed's contract); counted unclaimed only when it holds no
// claim.
func TestAReturningNameKeepsItsBlockInEachFormAgainstIpam(t *testing.T) {
	for _, tc := range []struct {
		form      ipamtest.Retained
		unclaimed float64
	}{
		{ipamtest.RetainedRebind, 0},
		{ipamtest.RetainedPlainConflict, 1},
		{ipamtest.RetainedCauseConflict, 1},
	} {
		t.Run(tc.form.String(), func(t *testing.T) {
			s := newIpamScene(t, ipamtest.Options{Retained: tc.form})
			team := "r-" + s.platform
			hub := s.start(ipamProject)
			id := s.liveNetwork(team, "net-a")
			s.cluster.Delete(t, hubctl.NetworkResource, team, "net-a")
			s.await("A's claim released", time.Minute, func() bool { _, err := s.claim(team, "net-a"); return err != nil })
			s.network(team, "net-a")
			s.await("A's identity again", time.Minute, func() bool { _, ok := s.identity(team, "net-a"); return ok })
			if got, _ := s.identity(team, "net-a"); got != id {
				t.Fatalf("the returning name got fabric ID %d, want its block's %d", got, id)
			}
			s.await("galactic_hub_unclaimed_blocks", 30*time.Second, func() bool { return hub.metric("galactic_hub_unclaimed_blocks") == tc.unclaimed })
		})
	}
}

// The acceptance of issue 47, item 3, through the built binary: Milo's
// quota 403, in both its wordings, is counted as quota, and the network it
// refused is claimed within the fast retry once the unit comes back, which
// Milo does only after the claim is gone (here 2 s after).
func TestMilosQuotaRefusalIsQuotaAgainstIpam(t *testing.T) {
	for _, newest := range []bool{false, true} {
		t.Run(fmt.Sprintf("newest wording %v", newest), func(t *testing.T) {
			s := newIpamScene(t, ipamtest.Options{QuotaLimit: 1, QuotaReturnDelay: 2 * time.Second, NewestQuotaWording: newest})
			team := "q-" + s.platform
			hub := s.start(ipamProject)
			s.liveNetwork(team, "net-a")
			t.Cleanup(func() { s.cluster.Delete(t, hubctl.NetworkResource, team, "net-b") })
			s.network(team, "net-b")
			s.await("B refused as quota", time.Minute, func() bool {
				return hub.metric("galactic_hub_claim_quota_refusals_total") >= 1 &&
					hub.metric(`galactic_hub_networks_refused{class="quota"}`) == 1
			})
			// Let B's backoff grow, as it would on a hub that waited.
			time.Sleep(5 * time.Second)
			deleted := time.Now()
			s.cluster.Delete(t, hubctl.NetworkResource, team, "net-a")
			s.await("B's identity once A's unit is back", time.Minute, func() bool { _, ok := s.identity(team, "net-b"); return ok })
			// The unit is back 2 s after A's claim is gone; the fast retry
			// polls every 100 ms doubling to 2 s.
			if took := time.Since(deleted); took > 12*time.Second {
				t.Fatalf("B claimed %s after A was deleted, want within the fast retry", took)
			}
		})
	}
}

// The acceptance of issue 47, item 6, through the built binary: a
// configuration refusal and an exhausted pool are each named once, on the
// network and the metric.
func TestRefusalsAreNamedAgainstIpam(t *testing.T) {
	for _, tc := range []struct {
		what   string
		status func(platform string) *metav1.Status
		series string
		reason string
	}{
		{"no default class", func(string) *metav1.Status { return ipamtest.NoDefaultClass("IPv6") },
			`galactic_hub_claim_refusals_total{cause="bad_request",class="configuration"}`, "FabricIdentityClaimMisconfigured"},
		{"namespace terminating", ipamtest.NamespaceTerminating,
			`galactic_hub_claim_refusals_total{cause="namespace_terminating",class="configuration"}`, "FabricIdentityClaimMisconfigured"},
		{"pool exhausted", func(string) *metav1.Status { return ipamtest.PoolExhausted("fabric", 64, 65, 100) },
			`galactic_hub_claim_refusals_total{cause="exhausted",class="exhausted"}`, "FabricIdentityPoolExhausted"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			s := newIpamScene(t, ipamtest.Options{})
			s.svc.RefuseCreates(tc.status(s.platform))
			team := "c-" + s.platform
			hub := s.start(ipamProject)
			s.network(team, "net-a")
			t.Cleanup(func() { s.cluster.Delete(t, hubctl.NetworkResource, team, "net-a") })
			s.await("the refusal counted", time.Minute, func() bool { return hub.metric(tc.series) == 1 })
			s.await("the event on the network", time.Minute, func() bool {
				events, err := s.cs.CoreV1().Events(team).List(context.Background(), metav1.ListOptions{})
				if err != nil {
					return false
				}
				for _, e := range events.Items {
					if e.Reason == tc.reason && e.InvolvedObject.Name == "net-a" {
						return true
					}
				}
				return false
			})
			// Retried slowly: the hub's backoff of a transient error would
			// have tried again several times in 5 s.
			before := s.svc.Requests()["POST ipclaims"]
			time.Sleep(5 * time.Second)
			if n := s.svc.Requests()["POST ipclaims"] - before; n > 0 {
				t.Fatalf("%d creates in 5 s after a refusal that no retry mends", n)
			}
			if got := hub.metric(tc.series); got != 1 {
				t.Fatalf("%s = %v after the retries, want 1", tc.series, got)
			}
		})
	}
}
