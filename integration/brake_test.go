package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
)

// The accidents of real clusters that leave most of a node's taps looking
// stale at once, against a real API server: each must engage the
// mass-removal brake and remove nothing, until an operator releases it.
// On a build without the brake, each removed every unheld tap.

var crds = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// brakeState is what /v1/status says of the brake.
type brakeState struct {
	Engaged bool   `json:"engaged"`
	Reason  string `json:"reason"`
	Held    int    `json:"held"`
}

func (r *remoteNode) brake() brakeState {
	r.t.Helper()
	code, body := r.call("GET", "/v1/status", readToken)
	if code != 200 {
		r.t.Fatalf("GET /v1/status: %d %s", code, body)
	}
	var st struct{ Brake brakeState }
	if err := json.Unmarshal(body, &st); err != nil {
		r.t.Fatalf("status: %v: %s", err, body)
	}
	return st.Brake
}

// attachedTaps makes, for each attachment identifier, an unheld tap of VPC
// a stamped by its sandbox, and returns their names.
func (r *remoteNode) attachedTaps(atts ...string) []string {
	var names []string
	for _, att := range atts {
		r.tapAdd(att, "sandbox-"+att)
		names = append(names, fmt.Sprintf("G00000000a%03sH", att))
	}
	return names
}

// eachInventory runs test once in each of the daemon's inventory modes
// (--inventory): the brake must hold a mass deletion whichever way the
// node reads the cluster.
func eachInventory(t *testing.T, test func(t *testing.T, mode string)) {
	for _, mode := range []string{"candidates", "informers"} {
		t.Run(mode, func(t *testing.T) { test(t, mode) })
	}
}

// forceKeeping forces a pass and fails the test at once if it removed a
// tap: while a mass deletion reaches the node, every pass must keep all.
func (r *remoteNode) forceKeeping() passReport {
	r.t.Helper()
	rep := r.force("")
	if len(rep.Reclaimed) != 0 {
		r.t.Fatalf("a pass removed %v while the mass deletion reached the node: %s", rep.Reclaimed, rep.Reason)
	}
	return rep
}

// holdsThrough forces passes and checks that every tap in names stays and
// that the brake engaged, holding held taps.
func (r *remoteNode) holdsThrough(names []string, held int) {
	r.t.Helper()
	for i := range 3 {
		rep := r.force("")
		if len(rep.Reclaimed) != 0 {
			r.t.Fatalf("pass %d removed %v: the brake must hold a mass removal", i, rep.Reclaimed)
		}
	}
	for _, name := range names {
		if !r.exists(name) {
			r.t.Fatalf("%s removed", name)
		}
	}
	if b := r.brake(); !b.Engaged || b.Held != held {
		r.t.Fatalf("brake %+v, want engaged holding %d", b, held)
	}
	if m := r.metrics(); !strings.Contains(m, "galactic_cni_mass_removal_brake_engaged 1") ||
		!strings.Contains(m, "galactic_cni_mass_removal_brake_held_taps "+strconv.Itoa(held)) {
		r.t.Fatalf("brake metrics do not say engaged, %d held", held)
	}
}

// A helm reinstall of the VPCAttachment CRD deletes every attachment; one
// new, unrelated attachment then makes the inventory healthy again. The
// node's five taps whose attachments went with the CRD must stay.
func TestAReinstalledCRDWithOneNewObjectRemovesNothing(t *testing.T) {
	eachInventory(t, func(t *testing.T, mode string) {
		cluster := clustertest.Start(t)
		t.Cleanup(func() { _ = cluster.Env.Stop() })
		atts := []string{"1", "2", "3", "4", "5"}
		for _, att := range atts {
			cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-"+att, "a", att))
		}
		r := newRemoteNode(t, cluster)
		names := r.attachedTaps(atts...)
		r.start("--inventory", mode)
		if rep := r.force(""); len(rep.Reclaimed) != 0 || r.pending(names[0]) {
			t.Fatalf("a pass with every attachment present: %+v", rep)
		}

		ctx := context.Background()
		crd := "vpcattachments.cloud.datumapis.com"
		if err := cluster.Client.Resource(crds).Delete(ctx, crd, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the CRD gone", func() (bool, string) {
			_, err := cluster.Client.Resource(crds).Get(ctx, crd, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		r.forceKeeping()
		if _, err := envtest.InstallCRDs(cluster.Config, envtest.CRDInstallOptions{
			Paths: []string{filepath.Join("..", "deploy", "crds", "cloud.datumapis.com_vpcattachments.yaml")}, ErrorIfPathMissing: true,
		}); err != nil {
			t.Fatalf("reinstall the CRD: %v", err)
		}
		cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-b", "db-1", "b", "1"))
		eventually(t, "the node sees the new attachment", func() (bool, string) {
			rep := r.forceKeeping()
			return rep.Result == "completed" && r.pending(names[0]), rep.Result + ": " + rep.Reason
		})
		r.holdsThrough(names, len(names))
	})
}

// Deleting a namespace that holds three of a node's four attachments leaves
// three taps stale at once: they stay. The API server here runs no
// namespace controller; the test deletes the namespace's attachments with
// one DeleteCollection after the namespace, as that controller does.
//
// The operator's release, `galactic-node pass --allow-mass-removal` run as
// root on the node, then removes the three and keeps the fourth.
func TestANamespaceDeleteHoldsItsTapsUntilReleased(t *testing.T) {
	eachInventory(t, func(t *testing.T, mode string) {
		cluster := sharedWithLiveAttachment(t)
		doomed := fmt.Sprintf("tenant-doomed-%d", time.Now().UnixNano()%1e6)
		for _, att := range []string{"2", "3", "4"} {
			cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment(doomed, "web-"+att, "a", att))
		}
		r := newRemoteNode(t, cluster)
		names := r.attachedTaps("1", "2", "3", "4")
		r.start("--inventory", mode)
		r.force("")

		ctx := context.Background()
		namespaces := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
		if err := cluster.Client.Resource(namespaces).Delete(ctx, doomed, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := cluster.Client.Resource(kubeinventory.AttachmentResource).Namespace(doomed).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the node sees the namespace's attachments gone", func() (bool, string) {
			rep := r.forceKeeping()
			return r.pending(names[1]) && r.pending(names[3]), rep.Result + ": " + rep.Reason
		})
		r.holdsThrough(names, 3)

		// The release, through the CLI an operator runs.
		out, err := exec.Command("ip", "netns", "exec", r.ns.Name, binary, "pass", "--allow-mass-removal", "--socket", r.socket).CombinedOutput()
		if err != nil {
			t.Fatalf("galactic-node pass --allow-mass-removal: %v: %s", err, out)
		}
		if !strings.Contains(string(out), "mass-removal brake released") {
			t.Errorf("the CLI does not say the brake was released:\n%s", out)
		}
		for _, name := range names[1:] {
			if r.exists(name) {
				t.Errorf("%s kept after the release:\n%s", name, out)
			}
		}
		if !r.exists(names[0]) {
			t.Fatal("the live attachment's tap was removed")
		}
		if b := r.brake(); b.Engaged {
			t.Fatalf("brake %+v after the release", b)
		}
		if !strings.Contains(r.metrics(), "galactic_cni_mass_removal_brake_engaged 0") {
			t.Fatal("the brake metric still says engaged")
		}
	})
}

// `kubectl delete vpcattachments --all -A`, then one of them re-created:
// four of five taps stale at once stay.
func TestDeleteAllThenOneRecreateRemovesNothing(t *testing.T) {
	eachInventory(t, func(t *testing.T, mode string) {
		cluster := sharedWithLiveAttachment(t)
		for _, att := range []string{"2", "3", "4", "5"} {
			cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-"+att, "a", att))
		}
		r := newRemoteNode(t, cluster)
		names := r.attachedTaps("1", "2", "3", "4", "5")
		r.start("--inventory", mode)
		r.force("")

		cluster.DeleteAll(t, kubeinventory.AttachmentResource)
		r.forceKeeping()
		cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-1", "a", "1"))
		eventually(t, "the node sees the re-created attachment", func() (bool, string) {
			rep := r.forceKeeping()
			return rep.Result == "completed" && r.pending(names[1]) && !r.pending(names[0]), rep.Result + ": " + rep.Reason
		})
		r.holdsThrough(names, 4)
	})
}

// A file inventory that drops ten of a node's eleven attachments at once
// (a file written half, a template gone wrong) engages the brake too.
func TestAFileThatDropsMostAttachmentsRemovesNothing(t *testing.T) {
	n := newNode(t)
	docs := []string{liveAttachment}
	var names []string
	for i := 2; i <= 11; i++ {
		att := strconv.Itoa(i)
		docs = append(docs, fmt.Sprintf("apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: web-%d, namespace: t}\nstatus: {vpc: a, vpcAttachment: %q}\n", i, att))
		name := fmt.Sprintf("G00000000a%03dH", i)
		n.stampedTap(name, "sandbox-"+att, tun.Mode{})
		names = append(names, name)
	}
	path := n.writeInventory(docs...)
	d := n.run(t, "--inventory-file", path)
	n.ready(t, d)
	n.force("")
	n.writeInventory(liveAttachment)
	for i := range 3 {
		if rep := n.force(""); len(rep.Reclaimed) != 0 {
			t.Fatalf("pass %d removed %v", i, rep.Reclaimed)
		}
	}
	for _, name := range names {
		if !n.exists(name) {
			t.Fatalf("%s removed", name)
		}
	}
	code, body := n.call("GET", "/v1/status", readToken)
	var st struct{ Brake brakeState }
	if err := json.Unmarshal(body, &st); code != 200 || err != nil || !st.Brake.Engaged || st.Brake.Held != 10 {
		t.Fatalf("status %d %s: want the brake engaged holding 10", code, body)
	}
}

// `galactic-node taps`, run as an operator runs it on the node, names the
// carriers of each tap in either inventory mode: the candidates inventory,
// which keeps no copy of the cluster, asks the API server for the view.
// A tap nothing carries shows none, and no carrier is ever "unknown" here.
func TestTheTapsViewNamesCarriersInEachMode(t *testing.T) {
	cluster := sharedWithLiveAttachment(t)
	eachInventory(t, func(t *testing.T, mode string) {
		r := newRemoteNode(t, cluster)
		r.attachedTaps("1", "2")
		r.start("--inventory", mode)
		out, err := exec.Command("ip", "netns", "exec", r.ns.Name, binary, "taps", "-o", "json", "--socket", r.socket).CombinedOutput()
		if err != nil {
			t.Fatalf("galactic-node taps -o json: %v: %s", err, out)
		}
		var list struct {
			Items []struct {
				Name            string
				CarriedBy       []struct{ Kind, Namespace, Name string }
				CarriersUnknown string
				State           string
			}
		}
		if err := json.Unmarshal(out, &list); err != nil {
			t.Fatalf("taps -o json: %v: %s", err, out)
		}
		got := map[string]string{}
		for _, tp := range list.Items {
			if tp.CarriersUnknown != "" {
				t.Errorf("%s: carriers unknown: %s", tp.Name, tp.CarriersUnknown)
			}
			var names []string
			for _, c := range tp.CarriedBy {
				names = append(names, c.Kind+" "+c.Namespace+"/"+c.Name)
			}
			got[tp.Name] = strings.Join(names, ",") + " " + tp.State
		}
		if want := "VPCAttachment tenant-a/web-1 live"; got["G00000000a001H"] != want {
			t.Errorf("carried tap: %q, want %q", got["G00000000a001H"], want)
		}
		if want := " stale"; got["G00000000a002H"] != want {
			t.Errorf("stale tap: %q, want %q (no carrier)", got["G00000000a002H"], want)
		}
	})
}
