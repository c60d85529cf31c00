package integration

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/test/framework/nettest"
	"github.com/datum-cloud/galactic-node/test/framework/vmtest"
)

// readmePolicy is the README's example policy: allow by default, the
// ethertypes and protocols a VM needs, DNS and DHCP on the host.
var readmePolicy = map[string]any{
	"singleQueue":   true,
	"policy":        map[string]any{"defaultAction": "allow", "ethertypes": []int{2048, 2054, 34525}, "protocols": []int{1, 6, 17, 58}},
	"hostOnlyPorts": []string{"udp/53", "udp/67"},
}

// TestAGuestsTrafficGoesThroughTheDatapath boots a real guest (QEMU under
// TCG, a Debian kernel and busybox) on a single-queue tap the built plugin
// made under the README's example policy. The guest resolves its gateway by
// ARP and pings it; its UDP to a host port the policy does not list is
// denied and counted so against its attachment. The daemon keeps the
// guest's tap, whose identity lives, through two forced passes.
func TestAGuestsTrafficGoesThroughTheDatapath(t *testing.T) {
	s := newHolderScene(t)
	s.h.mustCNI("ADD", fmt.Sprintf("%064s", "guest"), s.h.conf("3", readmePolicy))
	tap := tapName("3")
	// The gateway lives on the VRF; the bridge stands in for it here, and
	// forwarding is on, as on a node (docs/datapath.md, rule 12).
	s.n.ns.IP(t, "addr", "add", "10.10.0.254/24", "dev", "G00000000aV")
	nettest.Run(t, "ip", "netns", "exec", s.n.ns.Name, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	_, log := s.n.start("--inventory-file", s.n.writeInventory(liveAttachment, attachmentDoc("guest", "3")))
	s.n.waitReady(log)

	vm := vmtest.Start(t, vmtest.Options{NetNS: s.n.ns.Name, Boot: true,
		Netdevs: []string{"tap,id=n0,ifname=" + tap + ",script=no,downscript=no,vhost=off"},
		Devices: []string{"virtio-net-pci,netdev=n0,mac=52:54:00:0a:00:03"},
		Append:  "galactic.ip=10.10.0.3/24 galactic.gw=10.10.0.254 galactic.udp=10.10.0.254:9999"})
	vm.WaitConsole(t, "GALACTIC-DONE", 5*time.Minute)
	console := vm.Console()
	for _, want := range []string{"GALACTIC-ARP-OK", "GALACTIC-PING-OK", "GALACTIC-UDP-SENT"} {
		if !strings.Contains(console, want) {
			t.Fatalf("the guest did not report %s:\n%s", want, console)
		}
	}
	got := guestDecisions(t, s, "3")
	if got["host_only"] == 0 || got["allow"] == 0 || got["deny"] < 5 {
		t.Fatalf("decisions of a/3 = %v; want ARP counted host_only, the pings allowed and the 5 datagrams to an unlisted host port denied", got)
	}

	before := s.rows(tap)
	s.n.force("")
	s.n.force("")
	if now := s.rows(tap); now != before {
		t.Fatalf("the guest's tap's rows changed over two passes:\nbefore %s\nafter  %s", before, now)
	}
}

// attachmentDoc is an inventory document carrying VPC a's attachment att.
func attachmentDoc(name, att string) string {
	return fmt.Sprintf("apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {name: %s, namespace: t}\nstatus: {vpc: a, vpcAttachment: %q}\n", name, att)
}

// guestDecisions returns the decisions counted against VPC a's attachment
// att, by decision, as the operator's CLI shows the decisions map.
func guestDecisions(t *testing.T, s *holderScene, att string) map[string]uint64 {
	t.Helper()
	out, err := exec.Command(binary, "maps", "decisions", "--socket", s.n.socket, "-o", "json").CombinedOutput()
	if err != nil {
		t.Fatalf("galactic-node maps decisions: %v: %s", err, out)
	}
	var rows struct {
		Items []struct {
			Key struct {
				VPC        string `json:"vpc"`
				Attachment string `json:"attachment"`
				Decision   string `json:"decision"`
			} `json:"key"`
			Value uint64 `json:"value"`
		} `json:"items"`
	}
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("decisions: %v: %s", err, out)
	}
	got := map[string]uint64{}
	for _, r := range rows.Items {
		if r.Key.VPC == "a" && r.Key.Attachment == att {
			got[r.Key.Decision] += r.Value
		}
	}
	return got
}
