package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// liveAttachment is an inventory document carrying a/1, so that an
// inventory file is healthy.
const liveAttachment = "apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: live, namespace: t}\nstatus: {vpc: a, vpcAttachment: \"1\"}\n"

// writeInventory writes the inventory file of n and returns its path.
func (n *node) writeInventory(docs ...string) string {
	n.t.Helper()
	path := filepath.Join(n.dir, "inventory.yaml")
	if err := os.WriteFile(path, []byte(strings.Join(docs, "---\n")), 0o600); err != nil {
		n.t.Fatal(err)
	}
	return path
}

// stampedTap makes a persistent tap stamped by owner with no fd open, as a
// VMM leaves it when it exits without CNI DEL.
func (n *node) stampedTap(name, owner string, mode tun.Mode) {
	n.t.Helper()
	nettest.NewTap(n.t, n.ns, name, mode)
	n.ns.IP(n.t, "link", "set", name, "alias", owner, "up")
}

// force runs a forced pass and decodes its report.
func (n *node) force(query string) passReport {
	n.t.Helper()
	code, body := n.call("POST", "/v1/passes"+query, adminToken)
	if code != http.StatusOK {
		n.t.Fatalf("POST /v1/passes%s: %d %s", query, code, body)
	}
	var rep passReport
	if err := json.Unmarshal(body, &rep); err != nil {
		n.t.Fatalf("pass report: %v: %s", err, body)
	}
	return rep
}

type passReport struct {
	Result    string                  `json:"result"`
	Reason    string                  `json:"reason"`
	Reclaimed []struct{ Name string } `json:"reclaimed"`
	Kept      []struct {
		Tap struct{ Name string } `json:"tap"`
		Why string                `json:"why"`
	} `json:"kept"`
}

func (n *node) exists(name string) bool {
	_, gone := n.linkGone(name)
	return !gone
}

// A single-queue tap reports no queue counts, and tun takes carrier off
// while a process holds it: the built daemon must keep such a tap held, and
// still reclaim a free one, which the kernel's answer to its attach proves
// free.
func TestTheDaemonKeepsAHeldSingleQueueTapWithCarrierOff(t *testing.T) {
	n := newNode(t)
	inv := n.writeInventory(liveAttachment)
	held, free := "G00000000a005H", "G00000000a006H"
	n.stampedTap(held, "sandbox-5", tun.Mode{SingleQueue: true})
	n.stampedTap(free, "sandbox-6", tun.Mode{SingleQueue: true})
	nettest.Hold(t, n.ns, held, nettest.HoldOptions{Mode: tun.Mode{SingleQueue: true}})
	n.ns.IP(t, "link", "set", held, "carrier", "off")

	_, log := n.start("--inventory-file", inv)
	n.waitReady(log)
	n.force("")
	rep := n.force("")
	if !n.exists(held) {
		t.Fatalf("the held single-queue tap with carrier off was removed: %+v\n%s", rep, log)
	}
	if n.exists(free) || len(rep.Reclaimed) != 1 || rep.Reclaimed[0].Name != free {
		t.Fatalf("the free single-queue tap: %+v", rep)
	}
	if len(rep.Kept) != 1 || rep.Kept[0].Tap.Name != held || !strings.Contains(rep.Kept[0].Why, "EBUSY") {
		t.Fatalf("the report does not say why the held tap was kept: %+v", rep)
	}
}

// The operator's view of such a tap must agree with the pass: one held by
// a file no /proc scan sees (in flight over SCM_RIGHTS), carrier off, its
// identity carried by nothing, is a candidate of the reclaim, and
// `galactic-node taps` asks the kernel and reads it held; a free one reads
// a candidate.
func TestTheTapsViewReadsAHeldSingleQueueTapWithCarrierOffHeld(t *testing.T) {
	n := newNode(t)
	held, free := "G00000000a005H", "G00000000a006H"
	n.stampedTap(held, "sandbox-5", tun.Mode{SingleQueue: true})
	n.stampedTap(free, "sandbox-6", tun.Mode{SingleQueue: true})
	nettest.HoldInFlight(t, n.ns, held, tun.Mode{SingleQueue: true})
	n.ns.IP(t, "link", "set", held, "carrier", "off")

	// The pass only marks: no candidate is old enough to confirm.
	_, log := n.start("--inventory-file", n.writeInventory(liveAttachment), "--min-candidate-age", "1h")
	n.waitReady(log)
	if rep := n.force(""); len(rep.Reclaimed) != 0 {
		t.Fatalf("a marking pass removed taps: %+v", rep)
	}
	out, err := exec.Command(binary, "taps", "--socket", n.socket, "-o", "json").CombinedOutput()
	if err != nil {
		t.Fatalf("galactic-node taps: %v: %s", err, out)
	}
	var taps struct {
		Items []struct {
			Name    string `json:"name"`
			Held    bool   `json:"held"`
			HeldWhy string `json:"heldWhy"`
			State   string `json:"state"`
		} `json:"items"`
	}
	if err := json.Unmarshal(out, &taps); err != nil {
		t.Fatalf("taps -o json: %v: %s", err, out)
	}
	seen := 0
	for _, tp := range taps.Items {
		switch tp.Name {
		case held:
			seen++
			if !tp.Held || tp.State != "held" || !strings.Contains(tp.HeldWhy, "EBUSY") {
				t.Errorf("the held tap reads held=%v state=%s heldWhy=%q, want held, the kernel's refusal", tp.Held, tp.State, tp.HeldWhy)
			}
		case free:
			seen++
			if tp.Held || tp.State != "candidate" {
				t.Errorf("the free tap reads held=%v state=%s heldWhy=%q, want a candidate", tp.Held, tp.State, tp.HeldWhy)
			}
		}
	}
	if seen != 2 {
		t.Fatalf("taps lists %d of the two taps: %s", seen, out)
	}
}

// Two passes a moment apart must not confirm a tap whose VMM may not have
// opened it yet: --min-candidate-age holds forced passes too, pending shows
// when a candidate becomes eligible, and a misspelt dryRun runs nothing.
func TestTwoForcedPassesInAMomentConfirmNothing(t *testing.T) {
	n := newNode(t)
	inv := n.writeInventory(liveAttachment)
	n.tapAdd("3", "sandbox-3")
	_, log := n.start("--inventory-file", inv, "--min-candidate-age", "2s")
	n.waitReady(log)

	n.force("")
	time.Sleep(400 * time.Millisecond)
	if rep := n.force(""); !n.exists("G00000000a003H") || len(rep.Reclaimed) != 0 {
		t.Fatalf("two passes 0.4 s apart removed the tap: %+v", rep)
	}
	code, body := n.call("GET", "/v1/taps/pending", readToken)
	var pending struct {
		Items []struct {
			FirstSeen  time.Time `json:"firstSeen"`
			EligibleAt time.Time `json:"eligibleAt"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &pending); err != nil || code != http.StatusOK || len(pending.Items) != 1 ||
		pending.Items[0].EligibleAt.Sub(pending.Items[0].FirstSeen) != 2*time.Second {
		t.Fatalf("pending: %d %s; want eligibleAt 2 s after firstSeen", code, body)
	}
	for _, q := range []string{"?dryrun=true", "?dry_run=true", "?DryRun=true"} {
		if code, body := n.call("POST", "/v1/passes"+q, adminToken); code != http.StatusBadRequest {
			t.Fatalf("POST /v1/passes%s: %d %s, want 400", q, code, body)
		}
	}
	time.Sleep(time.Until(pending.Items[0].EligibleAt))
	if rep := n.force(""); n.exists("G00000000a003H") || len(rep.Reclaimed) != 1 {
		t.Fatalf("a pass once eligible: %+v", rep)
	}
	code, body = n.call("GET", "/v1/passes", readToken)
	var passes struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &passes); err != nil || code != http.StatusOK || len(passes.Items) != 3 {
		t.Fatalf("passes: %d, %d reports; want the 3 forced ones, none for a refused request", code, len(passes.Items))
	}
}

// The inventory file holds identifiers as the text written, whatever YAML
// 1.1 would make of it unquoted: 0x1A is not 26 and 010 is not 8.
func TestUnquotedIdentifiersKeepTheirTaps(t *testing.T) {
	n := newNode(t)
	inv := n.writeInventory(liveAttachment,
		"apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: hex, namespace: t}\nstatus: {vpc: 0x1A, vpcAttachment: 010}\n",
		"apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: zero, namespace: t}\nstatus: {vpc: a, vpcAttachment: 0012}\n")
	kept := []string{"G000000x1A010H", "G00000000a012H"}
	for i, name := range kept {
		n.stampedTap(name, "sandbox-"+string(rune('a'+i)), tun.Mode{})
	}
	// What the unquoted values would mean read as YAML 1.1 numbers.
	decoys := []string{"G000000026008H", "G00000000a010H"}
	for i, name := range decoys {
		n.stampedTap(name, "decoy-"+string(rune('a'+i)), tun.Mode{})
	}
	_, log := n.start("--inventory-file", inv)
	n.waitReady(log)
	n.force("")
	rep := n.force("")
	for _, name := range kept {
		if !n.exists(name) {
			t.Errorf("%s, carried by an unquoted identifier, was removed: %+v", name, rep)
		}
	}
	for _, name := range decoys {
		if n.exists(name) {
			t.Errorf("%s, carried by nothing, was kept: %+v", name, rep)
		}
	}
}

// An object whose identity fields are set but cannot be read blocks only
// what it could denote: one whose VPC reads keeps that VPC's taps (it may be
// the one meant to carry them), one whose VPC does not read blocks nothing,
// and the pass goes on for every other tenant. The metric counts them by
// kind (a label of their names would be the tenants').
func TestAMalformedObjectBlocksOnlyWhatItCouldDenote(t *testing.T) {
	n := newNode(t)
	inv := n.writeInventory(liveAttachment,
		"apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: broken, namespace: t}\nstatus: {vpc: aaaaaaaaaaaaaaaaa, vpcAttachment: \"3\"}\n",
		"apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: half, namespace: t}\nstatus: {vpc: b, vpcAttachment: zzzzzz}\n")
	n.tapAdd("3", "sandbox-3")
	n.stampedTap("G00000000b004H", "sandbox-b4", tun.Mode{})
	_, log := n.start("--inventory-file", inv)
	n.waitReady(log)
	n.force("")
	rep := n.force("")
	if rep.Result != "completed" || n.exists("G00000000a003H") {
		t.Fatalf("a pass beside objects that denote nothing of VPC a kept its stale tap: %+v", rep)
	}
	for range 2 {
		n.force("")
	}
	if !n.exists("G00000000b004H") {
		t.Fatal("the tap of VPC b, which a malformed object may be meant to carry, was removed")
	}
	out := n.metrics()
	if want := `galactic_cni_inventory_malformed_objects{kind="VPCAttachment"} 2`; !strings.Contains(out, want) {
		t.Fatalf("metrics lack %s:\n%s", want, out)
	}
}

// The CNI plugin runs once per ADD and DEL: it links the teardown, not the
// cluster client nor the metrics library the daemon uses.
func TestTheCNIPluginLinksNoClusterOrMetricsClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../cmd/galactic-tap").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "k8s.io/") || strings.Contains(dep, "prometheus") {
			t.Errorf("galactic-tap depends on %s", dep)
		}
	}
}
