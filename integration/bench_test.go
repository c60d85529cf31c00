package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// BenchmarkDaemonRSSAt10000TapsAnd100000Identities runs the built daemon in
// a netns of 10,000 stamped taps with an inventory of 100,000 identities
// (carrying the taps), forces passes, and reports its resident memory.
func BenchmarkDaemonRSSAt10000TapsAnd100000Identities(b *testing.B) {
	const taps, identities = 10000, 100000
	n := &node{ns: nettest.NewNS(b), dir: b.TempDir()}
	n.bpffs = nettest.BPFFS(b)
	n.socket = filepath.Join(n.dir, "admin.sock")
	n.tokens = filepath.Join(n.dir, "tokens")
	if err := os.WriteFile(n.tokens, []byte("admin "+adminToken+"\nread "+readToken+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	var batch strings.Builder
	for i := range taps {
		id := identity.Identity{VPC: identity.VPC(1 + i/1000), Attachment: identity.Attachment(i % 1000)}
		nettest.NewTap(b, n.ns, id.TapName(), tun.Mode{})
		fmt.Fprintf(&batch, "link set %s alias sandbox-%d\n", id.TapName(), i)
	}
	cmd := exec.Command("ip", "-n", n.ns.Name, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("ip -batch: %v: %.200s", err, out)
	}
	var inv bytes.Buffer
	for i := range identities {
		fmt.Fprintf(&inv, "---\napiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: att-%d, namespace: t}\nstatus: {vpc: %q, vpcAttachment: %q}\n",
			i, identity.VPC(1+i/1000).Base62(), identity.Attachment(i%1000).Base62())
	}
	invPath := filepath.Join(n.dir, "inventory.yaml")
	if err := os.WriteFile(invPath, inv.Bytes(), 0o600); err != nil {
		b.Fatal(err)
	}
	daemon, log := n.startFor(b, "--inventory-file", invPath, "--metrics-listen", "")
	n.waitReadyFor(b, log)
	var rss, hwm float64
	for b.Loop() {
		if code, body := n.callFresh("POST", "/v1/passes", adminToken); code != 200 || !strings.Contains(string(body), `"stampedTaps": 10000`) {
			b.Fatalf("pass: %d %.300s", code, body)
		}
	}
	rss, hwm = procMemMiB(b, daemon.Process.Pid)
	b.ReportMetric(rss, "rss-MiB")
	b.ReportMetric(hwm, "peak-rss-MiB")
}

func procMemMiB(b *testing.B, pid int) (rss, hwm float64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "VmHWM:":
			hwm = kb / 1024
		}
	}
	return rss, hwm
}

// unreclaimableSlabKiB reads SUnreclaim from /proc/meminfo: kernel memory
// no cache shrinker gives back, what a device pins while it exists.
func unreclaimableSlabKiB(tb testing.TB) float64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		tb.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "SUnreclaim:" {
			v, _ := strconv.ParseFloat(f[1], 64)
			return v
		}
	}
	tb.Fatal("no SUnreclaim in /proc/meminfo")
	return 0
}

// BenchmarkKernelMemoryPerTap measures the unreclaimable slab each tap the
// built plugin makes pins, its default (single-queue) and multiqueue, against
// its peer in the same run: a veth pair with one end on a bridge, what a
// pod's bridge+host-local attachment costs. SUnreclaim is machine-wide, so
// other activity adds noise; 1,000 of each keeps it small.
func BenchmarkKernelMemoryPerTap(b *testing.B) {
	const count, multiCount = 1000, 200
	for b.Loop() {
		h := newCNIHost(b)
		perTap := func(n, first int, extra map[string]any) float64 {
			before := unreclaimableSlabKiB(b)
			for i := range n {
				h.mustCNI("ADD", fmt.Sprintf("%064d", first+i), h.conf(identity.Attachment(first+i).Base62(), extra))
			}
			return (unreclaimableSlabKiB(b) - before) / float64(n)
		}
		single := perTap(count, 1000, nil)
		// Another VPC: the bridge standing in for the VRF takes at most
		// 1,024 ports (BR_MAX_PORTS).
		multi := perTap(multiCount, 1000+count, map[string]any{"multiQueue": true, "vpc": "b", "table": 1011})

		peer := nettest.NewNS(b)
		peer.IP(b, "link", "add", "br0", "type", "bridge")
		peer.IP(b, "link", "set", "br0", "up")
		var batch strings.Builder
		for i := range count {
			fmt.Fprintf(&batch, "link add v%d type veth peer name p%d\nlink set v%d master br0 up\nlink set p%d up\n", i, i, i, i)
		}
		before := unreclaimableSlabKiB(b)
		cmd := exec.Command("ip", "-n", peer.Name, "-batch", "-")
		cmd.Stdin = strings.NewReader(batch.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("ip -batch: %v: %.200s", err, out)
		}
		perVeth := (unreclaimableSlabKiB(b) - before) / count
		b.ReportMetric(single, "KiB/tap")
		b.ReportMetric(multi, "KiB/multiqueue-tap")
		b.ReportMetric(perVeth, "KiB/veth-pair")
		b.ReportMetric(single/perVeth, "tap/veth")
		b.ReportMetric(multi/perVeth, "multiqueue-tap/veth")
	}
}
