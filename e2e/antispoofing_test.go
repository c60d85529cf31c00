package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A KubeVirt-shaped attachment (a definition of its own, a "mac", no
// address) must not start a VM that cannot talk: its pod fails with the
// plugin's error in its events. With "routes" it starts, its guest reaches
// the host, and what the guest then sends from another address is dropped
// as spoofed where an operator looks: the node's metrics, `galactic-node
// taps` and `galactic-node drops`.
func (n *node) scenarioAnAttachmentWithoutAddressesIsRefusedAndSpoofingShows(t *testing.T) {
	const mac = "02:00:0a:0a:00:08"
	n.attachment(t, "att-7", "a", "7")
	n.attachment(t, "att-8", "a", "8")
	kubevirt := func(definition string) string {
		return fmt.Sprintf(`[{"name": %q, "namespace": "galactic-system", "mac": %q}]`, definition, mac)
	}

	// No address: refused, visibly.
	n.applyNetworkDefinition(t, "galactic-a-7", `"vpc": "a", "vpcAttachment": "7"`)
	n.createPod(t, "vm-noaddr", kubevirt("galactic-a-7"))
	event := n.waitEvent(t, "vm-noaddr", "allowSpoofing", 3*time.Minute)
	for _, fix := range []string{`"routes"`, `"ips"`} {
		if !strings.Contains(event, fix) {
			t.Errorf("the pod's event does not name the fix %q: %s", fix, event)
		}
	}
	t.Logf("the pod's event: %s", event)
	for _, tap := range n.taps(t) {
		if tap.VPC == "a" && tap.Attachment == "7" {
			t.Fatalf("the refused attachment left tap %s", tap.Name)
		}
	}
	n.deletePod(t, tenantNS, "vm-noaddr")

	// With routes: it starts, and its guest talks.
	n.applyNetworkDefinition(t, "galactic-a-8", `"vpc": "a", "vpcAttachment": "8", "routes": ["10.10.0.8/32"]`)
	n.galacticPod(t, "vm-routes", kubevirt("galactic-a-8"))
	tap := n.tapOf(t, "a", "8")
	master := n.tapMaster(t, tap.Name)
	if out, err := n.inNode("ip", "addr", "add", "10.10.0.1/24", "dev", master).CombinedOutput(); err != nil {
		t.Fatalf("give the VRF stand-in %s the gateway's address: %v: %s", master, err, out)
	}
	guest := n.guestBinary(t)
	if out, err := n.inNode(guest, "arp", "-tap", tap.Name, "-mac", mac, "-src", "10.10.0.8", "-target", "10.10.0.1", "-timeout", "60s").CombinedOutput(); err != nil {
		t.Fatalf("the guest with its own address got no ARP reply from its gateway: %v: %s", err, out)
	}

	// From another address: spoofed, and visible.
	spoofedBefore := n.metric(t, `galactic_ebpf_decisions_total{decision="spoofed"}`)
	if out, err := n.inNode(guest, "udp", "-tap", tap.Name, "-mac", mac, "-src", "10.99.99.99", "-dst", "10.10.0.1", "-port", "53", "-count", "20").CombinedOutput(); err != nil {
		t.Fatalf("guest udp: %v: %s", err, out)
	}
	if got := n.metric(t, `galactic_ebpf_decisions_total{decision="spoofed"}`); got < spoofedBefore+20 {
		t.Fatalf("galactic_ebpf_decisions_total{decision=\"spoofed\"} went from %v to %v, want 20 more", spoofedBefore, got)
	}
	var views struct {
		Items []struct {
			Name      string            `json:"name"`
			Decisions map[string]uint64 `json:"decisions"`
		} `json:"items"`
	}
	out, err := n.galacticNode("taps", "-o", "json")
	if err != nil || json.Unmarshal([]byte(out), &views) != nil {
		t.Fatalf("taps -o json: %v: %s", err, out)
	}
	found := false
	for _, v := range views.Items {
		if v.Name == tap.Name {
			found = true
			if v.Decisions["spoofed"] < 20 {
				t.Fatalf("taps -o json counts %d spoofed for %s, want at least 20: %s", v.Decisions["spoofed"], tap.Name, out)
			}
		}
	}
	if table, err := n.galacticNode("taps"); err != nil || !found || !strings.Contains(table, "spoofed") {
		t.Fatalf("galactic-node taps shows no spoofed drops of %s: %v\n%s", tap.Name, err, table)
	}
	out, err = n.galacticNode("drops", "--tap", tap.Name, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Tap, Decision, SrcIP, DstIP, SrcMAC, Protocol, VPC, Attachment string
		Rule                                                           int
		DstPort                                                        int
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	seen := false
	for sc.Scan() && !seen {
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.SrcIP == "10.99.99.99" {
			seen = true
		}
	}
	if !seen || rec.Decision != "spoofed" || rec.DstIP != "10.10.0.1" || rec.DstPort != 53 || rec.Protocol != "udp" ||
		rec.SrcMAC != mac || rec.VPC != "a" || rec.Attachment != "8" || rec.Rule != 10 {
		t.Fatalf("galactic-node drops --tap %s has no record of the spoofed frame with its headers: %+v\n%s", tap.Name, rec, out)
	}
	if text, err := n.galacticNode("drops", "--tap", tap.Name); err != nil || !strings.Contains(text, "10.99.99.99:40000 > 10.10.0.1:53 udp") {
		t.Fatalf("galactic-node drops (text): %v\n%s", err, text)
	}
	n.deletePod(t, tenantNS, "vm-routes")
	n.waitNoTap(t, tap, 2*time.Minute)
}

// createPod creates a pod asking for networks and does not wait for it.
func (n *node) createPod(t *testing.T, name, networks string) {
	t.Helper()
	pod := n.podSpec(name, networks)
	if _, err := n.client.CoreV1().Pods(tenantNS).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitEvent waits for an event of the pod whose message contains want,
// as `kubectl describe pod` shows them, and returns its message.
func (n *node) waitEvent(t *testing.T, pod, want string, timeout time.Duration) string {
	t.Helper()
	var msg string
	err := n.waitFor(context.Background(), "an event of pod "+pod+" naming "+want, timeout, func() (bool, error) {
		events, err := n.client.CoreV1().Events(tenantNS).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if strings.Contains(e.Message, want) {
				msg = e.Reason + ": " + e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		out, _ := n.kubectlErr("describe", "pod", "-n", tenantNS, pod)
		t.Fatalf("%v\n%s", err, out)
	}
	return msg
}

// tapMaster is the name of the tap's master (the VRF, or its stand-in).
func (n *node) tapMaster(t *testing.T, tap string) string {
	t.Helper()
	out, err := n.inNode("ip", "-o", "link", "show", tap).CombinedOutput()
	if err != nil {
		t.Fatalf("ip link show %s: %v: %s", tap, err, out)
	}
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "master" && i+1 < len(f) {
			return f[i+1]
		}
	}
	t.Fatalf("tap %s has no master: %s", tap, out)
	return ""
}

// guestBinary builds the stand-in guest (e2e/testdata/guest) once per node.
func (n *node) guestBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(n.dir, "guest")
	build := exec.Command("go", "build", "-o", bin, "./e2e/testdata/guest")
	build.Dir = repoRoot()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the guest: %v: %s", err, out)
	}
	return bin
}

// metric is the value of one series of the daemon's metrics, read from its
// port on the node as Prometheus scrapes it; 0 when absent.
func (n *node) metric(t *testing.T, series string) float64 {
	t.Helper()
	out, err := n.inNode("curl", "-sS", "--max-time", "10", "http://127.0.0.1:9180/metrics").CombinedOutput()
	if err != nil {
		t.Fatalf("scrape the daemon: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return 0
}
