package integration

import (
	"context"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// apiAddr is where the node's namespace reaches the API server: over a
// veth into a namespace of its own, whose relay forwards to the API
// server on the host's loopback.
const apiAddr = "10.250.0.1"

var clusterRoles = schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}

// remoteNode is a node whose daemon reaches a real API server over a veth,
// as user (a node identity bound to a ClusterRole of its own), and whose
// packets to it a test can drop.
type remoteNode struct {
	*node
	cluster *clustertest.Cluster
	user    string
	role    string
	kubecfg string
}

func newRemoteNode(t *testing.T, cluster *clustertest.Cluster) *remoteNode {
	t.Helper()
	return newRemoteNodeVia(t, cluster, func(api *nettest.NS, listen, target string) {
		nettest.Forward(t, api, listen, target)
	})
}

// newRemoteNodeVia is newRemoteNode with relay, run in the API server's
// namespace, forwarding the node's listen address to target.
func newRemoteNodeVia(t *testing.T, cluster *clustertest.Cluster, relay func(api *nettest.NS, listen, target string)) *remoteNode {
	t.Helper()
	r := &remoteNode{node: newNode(t), cluster: cluster}
	r.user = "node-" + r.ns.Name[len(r.ns.Name)-6:]
	r.role = "galactic-node-e2e-" + r.user
	api := nettest.NewNS(t)
	nettest.Veth(t, r.ns, api, "10.250.0.2/30", apiAddr+"/30")
	host, err := url.Parse(cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	relay(api, net.JoinHostPort(apiAddr, host.Port()), host.Host)

	r.grant(t, []string{"list", "watch"})
	u, err := cluster.Env.AddUser(envtest.User{Name: r.user}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := u.Config()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["e2e"] = &clientcmdapi.Cluster{Server: "https://" + net.JoinHostPort(apiAddr, host.Port()), CertificateAuthorityData: cfg.CAData, TLSServerName: "localhost"}
	kc.AuthInfos["e2e"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: "e2e"}
	kc.CurrentContext = "e2e"
	r.kubecfg = filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, r.kubecfg); err != nil {
		t.Fatal(err)
	}
	return r
}

// grant makes the node's ClusterRole allow verbs on VPCAttachments (and
// list and watch on BGPAdvertisements), bound to the node's user.
func (r *remoteNode) grant(t *testing.T, attachmentVerbs []string) {
	t.Helper()
	ctx := context.Background()
	verbs := make([]any, len(attachmentVerbs))
	for i, v := range attachmentVerbs {
		verbs[i] = v
	}
	role := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
		"metadata": map[string]any{"name": r.role},
		"rules": []any{
			map[string]any{"apiGroups": []any{"cloud.datumapis.com"}, "resources": []any{"vpcattachments"}, "verbs": verbs},
			map[string]any{"apiGroups": []any{"network.datumapis.com"}, "resources": []any{"bgpadvertisements"}, "verbs": []any{"list", "watch"}},
			// deploy/node/rbac.yaml grants these in the default namespace only
			map[string]any{"apiGroups": []any{"events.k8s.io"}, "resources": []any{"events"}, "verbs": []any{"create", "patch"}},
		},
	}}
	ri := r.cluster.Client.Resource(clusterRoles)
	if old, err := ri.Get(ctx, r.role, metav1.GetOptions{}); err == nil {
		role.SetResourceVersion(old.GetResourceVersion())
		if _, err := ri.Update(ctx, role, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return
	} else if !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if _, err := ri.Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": r.role},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": r.role},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": r.user}},
	}}
	bindings := r.cluster.Client.Resource(schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"})
	if _, err := bindings.Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ri.Delete(context.Background(), r.role, metav1.DeleteOptions{})
		_ = bindings.Delete(context.Background(), r.role, metav1.DeleteOptions{})
	})
}

// start runs the daemon against the API server through the veth.
func (r *remoteNode) start(extra ...string) {
	r.t.Helper()
	_, log := r.node.start(append([]string{"--kubeconfig", r.kubecfg, "--inventory-proof-timeout", "2s", "--admin-forces-per-minute", "1000"}, extra...)...)
	r.waitReady(log)
}

// partition drops every packet between the node and the API server, sending
// no reset: watches hang and no read fails, as in a network partition.
func (r *remoteNode) partition(t *testing.T) func() {
	t.Helper()
	return nettest.Partition(t, r.ns, apiAddr)
}

func (r *remoteNode) pending(name string) bool {
	r.t.Helper()
	_, body := r.call("GET", "/v1/taps/pending", readToken)
	return strings.Contains(string(body), name)
}

// A node cut off from the API server, with no reset, keeps completing passes
// on what its watches last delivered. It must remove nothing while cut off,
// even a candidate whose attachment was created at the API server meanwhile,
// and its first healthy pass after the partition only marks.
func TestAPartitionedNodeRemovesNothing(t *testing.T) {
	cluster := sharedWithLiveAttachment(t)
	r := newRemoteNode(t, cluster)
	r.tapAdd("1", "sandbox-1")
	r.tapAdd("3", "sandbox-3")
	r.start("--inventory-max-age", "4s")
	r.force("")
	if !r.pending("G00000000a003H") {
		t.Fatal("the stale tap is not a candidate")
	}

	heal := r.partition(t)
	cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-3", "a", "3"))
	// The pass that would remove is skipped and forgets its candidates;
	// every pass after it first tries to prove the inventory again, and is
	// skipped too: a partitioned cache marks nothing.
	for i := range 4 {
		rep := r.force("")
		if !r.exists("G00000000a003H") || len(rep.Reclaimed) != 0 {
			t.Fatalf("pass %d during the partition removed a tap: %+v", i, rep)
		}
		if rep.Result != "skipped" || !strings.Contains(rep.Reason, "not proven current") {
			t.Fatalf("pass %d during the partition: %+v, want skipped, not proven current", i, rep)
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		// /readyz says only "not ready"; the reason is for a token holder.
		code, body := r.callFresh("GET", "/v1/status", readToken)
		if code == 200 && strings.Contains(string(body), "not proven current") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/v1/status during the partition: %d %s", code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The attachment goes again before the partition heals: the tap is
	// stale once more, and must still wait for two healthy passes.
	cluster.Delete(t, kubeinventory.AttachmentResource, "tenant-a", "web-3")
	heal()
	if rep := r.force(""); r.exists("G00000000a003H") == false || len(rep.Reclaimed) != 0 {
		t.Fatalf("the first pass after the partition removed the tap: %+v", rep)
	}
	deadline = time.Now().Add(30 * time.Second)
	for r.exists("G00000000a003H") {
		if time.Now().After(deadline) {
			t.Fatal("the healed node never reclaimed the stale tap")
		}
		time.Sleep(200 * time.Millisecond)
		r.force("")
	}
	if !r.exists("G00000000a001H") {
		t.Fatal("the live tap was removed")
	}
}

// sharedWithLiveAttachment is the shared API server holding only the
// attachment that carries a/1, so that the inventory is healthy.
func sharedWithLiveAttachment(t *testing.T) *clustertest.Cluster {
	t.Helper()
	cluster := clustertest.Shared(t)
	cluster.DeleteAll(t, kubeinventory.AttachmentResource)
	t.Cleanup(func() { cluster.DeleteAll(t, kubeinventory.AttachmentResource) })
	cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-1", "a", "1"))
	return cluster
}

// apiServerPID finds the kube-apiserver of cluster by its certificate folder.
func apiServerPID(t *testing.T, cluster *clustertest.Cluster) int {
	t.Helper()
	pid, err := clustertest.ProcessOf("kube-apiserver", cluster.Env.ControlPlane.APIServer.CertDir)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// After a SIGKILL of the API server nothing is removed: each pass that would
// remove reads the API server first, and that read fails. (A pass whose read
// succeeded before the kill may still remove what the read proved stale: the
// read comes before the VRF locks, so that CNI ADD never waits on the API
// server, and the recheck under the locks makes no request.)
func TestAKilledAPIServerStopsEveryRemoval(t *testing.T) {
	cluster := clustertest.Start(t)
	t.Cleanup(func() { _ = cluster.Env.Stop() })
	cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-1", "a", "1"))
	r := newRemoteNode(t, cluster)
	r.tapAdd("1", "sandbox-1")
	r.tapAdd("3", "sandbox-3")
	r.start()
	r.force("")

	if err := syscall.Kill(apiServerPID(t, cluster), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if rep := r.force(""); !r.exists("G00000000a003H") || len(rep.Reclaimed) != 0 {
			t.Fatalf("pass %d after the kill removed the tap: %+v", i, rep)
		}
	}
}

// Deleting an attachment, re-creating it and forcing a pass at once must
// never remove its tap, however far the node's cache is behind.
func TestARecreatedAttachmentKeepsItsTapEveryTime(t *testing.T) {
	cluster := sharedWithLiveAttachment(t)
	cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-3", "a", "3"))
	r := newRemoteNode(t, cluster)
	r.tapAdd("3", "sandbox-3")
	r.start()
	for i := range 20 {
		cluster.Delete(t, kubeinventory.AttachmentResource, "tenant-a", "web-3")
		deadline := time.Now().Add(10 * time.Second)
		for !r.pending("G00000000a003H") {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the tap never became a candidate", i)
			}
			r.force("")
		}
		cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-3", "a", "3"))
		if rep := r.force(""); !r.exists("G00000000a003H") || len(rep.Reclaimed) != 0 {
			t.Fatalf("round %d: a pass right after the re-create removed the tap: %+v", i, rep)
		}
	}
}

// A node that lost list on VPCAttachments keeps its open watch, but must not
// remove anything on it: the pass is skipped, naming the 403.
func TestARevokedListStopsRemovals(t *testing.T) {
	cluster := sharedWithLiveAttachment(t)
	r := newRemoteNode(t, cluster)
	r.tapAdd("3", "sandbox-3")
	r.start()
	r.force("")

	r.grant(t, []string{"watch"})
	u, err := cluster.Env.AddUser(envtest.User{Name: r.user}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(u.Config())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := dc.Resource(kubeinventory.AttachmentResource).List(context.Background(), metav1.ListOptions{Limit: 1})
		if apierrors.IsForbidden(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revocation never took effect: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rep := r.force("")
	if !r.exists("G00000000a003H") || rep.Result != "skipped" || !strings.Contains(rep.Reason, "403") {
		t.Fatalf("a pass with list revoked: %+v", rep)
	}
}
