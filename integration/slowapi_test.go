package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/inventory/kubeinventory"
	"github.com/datum-cloud/galactic-node/test/framework/clustertest"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// newSlowRemoteNode is newRemoteNode whose relay to the API server holds
// back every byte the API server sends by delay(): an API server, or a
// link to it, that slow. delay may change while the test runs.
func newSlowRemoteNode(t *testing.T, cluster *clustertest.Cluster, delay func() time.Duration) (*remoteNode, *nettest.Relay) {
	t.Helper()
	var relay *nettest.Relay
	r := newRemoteNodeVia(t, cluster, func(api *nettest.NS, listen, target string) {
		relay = nettest.ForwardDelayed(t, api, listen, target, delay)
	})
	return r, relay
}

// createAttachments creates n VPCAttachments in namespace ns, the i-th
// carrying id(i), each created and given its status as a controller would
// (create, then the status subresource), by 16 clients at once: one client
// takes minutes for 20,000 on two cores.
func createAttachments(t *testing.T, cluster *clustertest.Cluster, ns string, n int, id func(int) identity.Identity) {
	t.Helper()
	start := time.Now()
	// The first through Apply, which makes the namespace.
	cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment(ns, "att-0", id(0).VPC.Base62(), id(0).Attachment.Base62()))
	ri := cluster.Client.Resource(kubeinventory.AttachmentResource).Namespace(ns)
	var next atomic.Int64
	next.Store(1)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			ctx := context.Background()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				a := clustertest.Attachment(ns, fmt.Sprintf("att-%d", i), id(i).VPC.Base62(), id(i).Attachment.Base62())
				status := a.Object["status"]
				created, err := ri.Create(ctx, a, metav1.CreateOptions{})
				if err == nil {
					created.Object["status"] = status
					_, err = ri.UpdateStatus(ctx, created, metav1.UpdateOptions{})
				}
				if err != nil {
					errs <- fmt.Errorf("attachment %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	t.Logf("created %d VPCAttachments in %s", n, time.Since(start).Round(100*time.Millisecond))
}

// bulkID is the identity of the i-th filler attachment: VPCs from 0x1000,
// none of them the taps' VPC a.
func bulkID(i int) identity.Identity {
	return identity.Identity{VPC: identity.VPC(0x1000 + i/1000), Attachment: identity.Attachment(i % 1000)}
}

// forceAsync forces a pass without waiting: the report arrives on the
// channel (or what kept it: a pass answers in minutes at worst here).
func (r *remoteNode) forceAsync() <-chan passReport {
	done := make(chan passReport, 1)
	c := r.client()
	c.Timeout = 5 * time.Minute
	go func() {
		var rep passReport
		req, _ := http.NewRequest("POST", "http://node/v1/passes", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := c.Do(req)
		if err != nil {
			rep.Result, rep.Reason = "request failed", err.Error()
			done <- rep
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &rep) != nil {
			rep.Result, rep.Reason = fmt.Sprintf("HTTP %d", resp.StatusCode), string(body)
		}
		done <- rep
	}()
	return done
}

// ready reports whether /readyz answers 200.
func (r *remoteNode) ready() bool {
	resp, err := r.client().Get("http://node/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitReadiness waits until /readyz says want, and fails t with the
// status's reason if it never does.
func (r *remoteNode) waitReadiness(want bool, within time.Duration) {
	r.t.Helper()
	for deadline := time.Now().Add(within); r.ready() != want; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			_, body := r.callFresh("GET", "/v1/status", readToken)
			r.t.Fatalf("/readyz never said ready=%v within %s; status: %s", want, within, body)
		}
	}
}

func reclaimed(rep passReport, name string) bool {
	return slices.ContainsFunc(rep.Reclaimed, func(t struct{ Name string }) bool { return t.Name == name })
}

// At 20,000 VPCAttachments and an API server whose every answer takes 2 s
// to arrive, the informers' consistent read before a removal takes five
// pages, over 10 s in all, each page well within its bound, and the
// candidates' ask a few reads of one object: in each mode the stale tap is
// removed.
// (When --inventory-proof-timeout bounded the whole read, the read always
// timed out there, and nothing could ever be removed.)
func TestRemovalCompletesAt20000AttachmentsWith2sPerResponse(t *testing.T) {
	// A cluster of its own: 20,000 objects would outlast the shared
	// cluster's cleanup. Its request timeout is the API server's default
	// (60 s), not the tests' 5 s: the relay holds back the window updates'
	// effect, so the API server takes a few seconds to send each page.
	cluster := clustertest.StartWith(t, func(a *envtest.APIServer) { a.Configure().Set("request-timeout", "60s") })
	t.Cleanup(func() { _ = cluster.Env.Stop() })
	const n = 20000
	cluster.Apply(t, kubeinventory.AttachmentResource, clustertest.Attachment("tenant-a", "web-1", "a", "1"))
	createAttachments(t, cluster, "bulk", n-1, bulkID)

	eachInventory(t, func(t *testing.T, mode string) {
		var delay atomic.Int64
		r, _ := newSlowRemoteNode(t, cluster, func() time.Duration { return time.Duration(delay.Load()) })
		r.tapAdd("1", "sandbox-1")
		r.tapAdd("3", "sandbox-3")
		// The default bound, which the first flag (2 s) of start would lower.
		r.start("--inventory-proof-timeout", "10s", "--inventory", mode)
		if rep := r.force(""); !r.pending("G00000000a003H") {
			t.Fatalf("the stale tap is not a candidate: %+v", rep)
		}

		delay.Store(int64(2 * time.Second))
		start := time.Now()
		rep := r.force("")
		t.Logf("the removing pass over %d attachments, every answer 2 s late, took %s: %s %s", n, time.Since(start).Round(100*time.Millisecond), rep.Result, rep.Reason)
		if !reclaimed(rep, "G00000000a003H") || r.exists("G00000000a003H") {
			t.Fatalf("the stale tap was not removed: %s: %s (kept %+v)", rep.Result, rep.Reason, rep.Kept)
		}
		if !r.exists("G00000000a001H") {
			t.Fatal("the live tap was removed")
		}
	})
}

// readAnswerSize is how many bytes the API server sends for the first page
// of the consistent read a removing pass makes, asked as the daemon asks
// (gzip accepted: the API server compresses an answer over 128 KiB, and
// sends a probe's one object as it is).
func readAnswerSize(t *testing.T, cluster *clustertest.Cluster) int64 {
	t.Helper()
	hc, err := rest.HTTPClientFor(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	r := kubeinventory.AttachmentResource
	req, err := http.NewRequest("GET", fmt.Sprintf("%s/apis/%s/%s/%s?limit=5000", strings.TrimSuffix(cluster.Config.Host, "/"), r.Group, r.Version, r.Resource), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	// Set by hand, the transport leaves the answer compressed, as sent.
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("read the first page: %d, %v", resp.StatusCode, err)
	}
	return n
}

// With every answer of the API server 20 s late, a pass that removes reads
// it for 40 s or more; `tap add` in the same VPC must not wait for that
// read. Asserted causally: tap add returns while the relay still holds the
// answer the pass's read waits for. Readiness fails while the API server is
// 20 s behind (--inventory-max-age 10s), and comes back once it is not.
func TestTapAddDoesNotWaitForASlowProof(t *testing.T) {
	cluster := sharedWithLiveAttachment(t)
	// 1,000 more attachments make the read's first answer large, which
	// tells it from everything else the relay holds.
	createAttachments(t, cluster, "bulk", 1000, bulkID) // deleted with the rest by sharedWithLiveAttachment
	// What the relay holds while the read waits for its first page: at
	// least half that page, compressed. Nothing else the API server sends
	// comes near: a probe's answer (one object of each resource, probes one
	// at a time) is a few KiB, a bookmark less; no object changes meanwhile.
	size := readAnswerSize(t, cluster)
	bigAnswer := size / 2
	if bigAnswer < 16<<10 {
		t.Fatalf("the read's first page is %d bytes: too small to tell from a probe's answer", size)
	}
	t.Logf("the read's first page: %d bytes on the wire", size)

	var delay atomic.Int64
	r, relay := newSlowRemoteNode(t, cluster, func() time.Duration { return time.Duration(delay.Load()) })
	r.tapAdd("1", "sandbox-1")
	r.tapAdd("3", "sandbox-3")
	// A bound on each page beyond the delay: the read must be slow, not
	// failed.
	// The informers' read, whose first page is large enough to tell apart;
	// the candidates' ask is made at the same point of the pass, before
	// any lock (reclaim.pass), in reads of a few KiB.
	r.start("--inventory-max-age", "10s", "--inventory-proof-timeout", "60s", "--inventory", "informers")
	if rep := r.force(""); !r.pending("G00000000a003H") {
		t.Fatalf("the stale tap is not a candidate: %+v", rep)
	}

	delay.Store(int64(20 * time.Second))
	passStart := time.Now()
	pass := r.forceAsync() // confirms the candidate: it reads the API server
	for deadline := time.Now().Add(2 * time.Minute); relay.Held() < bigAnswer; time.Sleep(10 * time.Millisecond) {
		select {
		case rep := <-pass:
			t.Fatalf("the pass ended before its read's answer was held: %+v", rep)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay never held the read's answer (holds %d bytes)", relay.Held())
		}
	}
	t.Logf("the pass's read is answered and held back %s after the pass started", time.Since(passStart).Round(100*time.Millisecond))

	addStart := time.Now()
	r.tapAdd("5", "sandbox-5")
	wait := time.Since(addStart)
	heldAtReturn := relay.Held()
	t.Logf("tap add in the same VPC took %s; the relay held %d bytes when it returned", wait.Round(time.Millisecond), heldAtReturn)
	if heldAtReturn < bigAnswer {
		t.Fatalf("tap add returned only once the pass's read had its answer (the relay holds %d bytes): it waited %s for the read", heldAtReturn, wait.Round(time.Millisecond))
	}
	select {
	case rep := <-pass:
		t.Fatalf("the pass ended while its read's answer was held: %+v", rep)
	default:
	}

	r.waitReadiness(false, time.Minute)
	delay.Store(0)
	var rep passReport
	select {
	case rep = <-pass:
	case <-time.After(3 * time.Minute):
		t.Fatal("the pass never ended once the delay was lifted")
	}
	t.Logf("the pass took %s: %s %s", time.Since(passStart).Round(100*time.Millisecond), rep.Result, rep.Reason)
	if !reclaimed(rep, "G00000000a003H") || r.exists("G00000000a003H") {
		t.Fatalf("the stale tap was not removed: %s: %s (kept %+v)", rep.Result, rep.Reason, rep.Kept)
	}
	if !r.exists("G00000000a001H") || !r.exists("G00000000a005H") {
		t.Fatal("a live tap was removed")
	}
	r.waitReadiness(true, time.Minute)
}
