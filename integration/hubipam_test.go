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
	"github.com/datum-cloud/galactic-node/internal/clustertest"
	"github.com/datum-cloud/galactic-node/internal/ipamtest"
	"github.com/datum-cloud/galactic-node/internal/syncbuf"
)

// The built galactic-hubctl against a real kube-apiserver behind the
// ipam-shaped address service (internal/ipamtest), as a platform team runs
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

// start runs the built binary against the service, scoped to project (""
// for a kubeconfig that reaches the service unscoped).
func (s *ipamScene) start(project string) *hubProc {
	t := s.t
	t.Helper()
	p := &hubProc{log: &syncbuf.Buffer{}}
	addr := make(chan string, 1)
	cmd := exec.Command(hubctlBin(t), "--kubeconfig", writeKubeconfig(t, s.svc.Config(project)), "--platform-namespace", s.platform,
		"--id", "ipam-"+project+"-"+s.platform, "--listen", "127.0.0.1:0", "--log-format", "json", "--workers", "4")
	cmd.Env = cleanEnv()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = p.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = p.log.Write(append(line, '\n'))
			var m struct{ Msg, Address string }
			if json.Unmarshal(line, &m) == nil && m.Msg == "serving metrics and health" {
				addr <- m.Address
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("galactic-hubctl log:\n%s", tail(p.log.String(), 60))
		}
	})
	select {
	case p.metrics = <-addr:
	case <-exited:
		t.Fatalf("galactic-hubctl exited:\n%s", p.log.String())
	case <-time.After(time.Minute):
		t.Fatalf("galactic-hubctl did not serve metrics:\n%s", p.log.String())
	}
	return p
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
	s.network(team, "net-a")
	t.Cleanup(func() { s.cluster.Delete(t, hubctl.NetworkResource, team, "net-a") })
	s.await("A's identity", time.Minute, func() bool { _, ok := s.identity(team, "net-a"); return ok })
	id, _ := s.identity(team, "net-a")
	claimName := hubctl.ClaimName(team, "net-a")

	proxied, err := dynamic.NewForConfig(s.svc.Config(ipamProject))
	if err != nil {
		t.Fatal(err)
	}
	claims := proxied.Resource(hubctl.ClaimResource).Namespace(s.platform)
	// Once: the hook's own delete of the old claim comes through it too.
	var hooked atomic.Bool
	var recreated string
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
			recreated = string(c.GetUID())
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
		if err != nil || recreated == "" || string(claim.GetUID()) == recreated {
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
	s.network(team, "net-a")
	t.Cleanup(func() { s.cluster.Delete(t, hubctl.NetworkResource, team, "net-a") })
	s.await("A's identity", time.Minute, func() bool { _, ok := s.identity(team, "net-a"); return ok })
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
