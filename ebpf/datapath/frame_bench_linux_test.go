package datapath_test

import (
	"encoding/binary"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/netns"
)

// beforeObject is the program as it was before issue 21 (the datapath
// enforces what it documents), kept so that every run measures this build
// against it on the same maps, tap and frames: the fixes must cost at most
// 1.3 times what the program cost then.
const beforeObject = "testdata/tap_ingress_before_issue21.o"

// benchFrames are the frames measured: a tenant's UDP to an address routed
// away from the host, the common case, in both families; UDP to a listed
// port of the host; and UDP to 4,096 addresses in turn, the worst case of
// the program's cache of route answers (tap path only).
func benchFrames() map[string][][]byte {
	other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99} // not the bridge: flooded to no port, so the path after the program is short
	udp4To := func(dst string, port uint16) []byte {
		return eth(other, vmMAC, nil, etIPv4, ipv4(vm4, dst, protoUDP, udp(vm4, dst, 40000, port, make([]byte, 32)), ipv4Opts{}))
	}
	many := make([][]byte, 4096)
	for i := range many {
		many[i] = udp4To(fmt.Sprintf("10.9.%d.%d", i/256, i%256), 9999)
	}
	return map[string][][]byte{
		"udp4-far":               {udp4To(far4, 9999)},
		"udp6-far":               {eth(other, vmMAC, nil, etIPv6, ipv6(vm6, far6, nil, protoUDP, udp(vm6, far6, 40000, 9999, make([]byte, 32)), 0))},
		"udp4-host":              {udp4To(gw4, 53)},
		"udp4-4096-destinations": many,
	}
}

// benchScene is a tap with every row of a default-allow policy written and
// no program attached, the two programs to compare, and the nftables peer.
type benchScene struct {
	*tapScene
	progs map[string]*ebpf.Program // "before", "after"
}

// benchPolicy is the policy every mode enforces: default allow, the scene's
// host-only ports, anti-spoofing on.
var benchPolicy = datapath.Policy{Generation: 1, DefaultAction: datapath.ActionAllow}

func newBenchScene(b *testing.B) *benchScene {
	s := newTapScene(b, tenant{VPC: 62, Attachment: 90})
	// This build's program reads tap_rules; the old one the rows of its
	// time, written from the same registration.
	reg := s.registration(benchPolicy)
	errs := []error{
		s.dp.TapRules.Put(s.ifindex, reg.Rules(s.ifindex)),
		s.dp.IfindexVRF.Put(s.ifindex, datapath.VRFBinding{Table: 1062, VPC: s.id.VPC, Attachment: s.id.Attachment}),
		s.dp.EgressKind.Put(s.ifindex, datapath.EgressTap),
		s.dp.TenantGateway.Put(s.ifindex, reg.Gateway),
		s.dp.TrafficPolicy.Put(s.ifindex, benchPolicy),
	}
	for _, p := range reg.HostOnlyPorts {
		errs = append(errs, s.dp.HostOnlyPort.Put(p.On(s.ifindex), true))
	}
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	spec, err := ebpf.LoadCollectionSpec(beforeObject)
	if err != nil {
		b.Fatal(err)
	}
	// The old program runs on this build's maps: their layouts are unchanged.
	repl := map[string]*ebpf.Map{}
	for name := range spec.Maps {
		if t, err := s.dp.Table(name); err == nil {
			repl[name] = t.Map()
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		b.Fatalf("load %s on this build's maps: %v", beforeObject, err)
	}
	b.Cleanup(func() { coll.Close() })
	return &benchScene{tapScene: s, progs: map[string]*ebpf.Program{"before": coll.Programs["tap_ingress"], "after": s.dp.Program()}}
}

// nftPeer is what a user would write instead of the program: the same
// rules for the benchmark's policy (default allow; TCP and UDP to the host
// only on its host-only ports; the tenant bound to its MAC and addresses;
// no DHCP server, router advertisement or redirect from it) in an nftables
// netdev ingress chain on the tap. fib asks the kernel's route lookup in
// the main and local tables, where the scene's bridge, standing in for the
// VRF, has its addresses: "fib daddr . iif type", the program's lookup (the
// tap as input interface), did not find the bridge's addresses local from a
// bridge port in the netdev family here, and checkEnforces refused it.
func (s *benchScene) nftPeer() string {
	return fmt.Sprintf(`table netdev galactic_peer {
	chain tap {
		type filter hook ingress device %q priority 0; policy accept;
		ether saddr != %s drop
		meta protocol ip ip saddr 0.0.0.0 udp sport 68 udp dport 67 accept
		meta protocol ip ip saddr != %s drop
		meta protocol ip6 ip6 saddr != { %s, fe80::/10 } drop
		udp dport { 68, 546 } drop
		icmp type { redirect, router-advertisement } drop
		icmpv6 type { nd-router-advert, nd-redirect } drop
		meta protocol ip fib daddr type { local, broadcast, multicast } udp dport { 53, 67 } accept
		meta protocol ip fib daddr type { local, broadcast, multicast } tcp dport 22 accept
		meta protocol ip fib daddr type { local, broadcast, multicast } meta l4proto { tcp, udp } drop
		meta protocol ip6 fib daddr type { local, broadcast, multicast } udp dport { 53, 547 } accept
		meta protocol ip6 fib daddr type { local, broadcast, multicast } meta l4proto { tcp, udp } drop
	}
}
`, s.name, vmMAC, vm4, vm6)
}

// setNFT loads the peer's table into the scene's namespace, or removes it.
func (s *benchScene) setNFT(b *testing.B, on bool) {
	b.Helper()
	cmd := exec.Command("ip", "netns", "exec", s.ns.Name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(s.nftPeer())
	if !on {
		cmd = exec.Command("ip", "netns", "exec", s.ns.Name, "nft", "delete", "table", "netdev", "galactic_peer")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("nft (on=%v): %v: %s", on, err, out)
	}
}

// checkEnforces writes marked frames through the tap under the current
// mode and checks that it enforces the benchmark's rules: far traffic and a
// host-only port pass; an unlisted host port, another source address and
// another source MAC do not. A peer that enforced less would be cheaper for
// it.
func (s *benchScene) checkEnforces(b *testing.B, mode string) {
	b.Helper()
	for _, c := range []struct {
		name  string
		frame func(m []byte) []byte
		want  delivery
	}{
		{"udp4 elsewhere", func(m []byte) []byte { return udp4(brMAC, vm4, far4, 40000, 9999, ipv4Opts{})(m)[0] }, delivery{bridge: true}},
		{"udp4 to a listed host port", func(m []byte) []byte { return udp4(brMAC, vm4, gw4, 40000, 53, ipv4Opts{})(m)[0] }, delivery{bridge: true, socks: []string{"udp4:53"}}},
		{"udp4 to an unlisted host port", func(m []byte) []byte { return udp4(brMAC, vm4, gw4, 40000, 9999, ipv4Opts{})(m)[0] }, delivery{}},
		{"udp6 to an unlisted host port", func(m []byte) []byte { return udp6(brMAC, vm6, local6, nil, 40000, 9999)(m)[0] }, delivery{}},
		{"udp4 from another address", func(m []byte) []byte { return udp4(brMAC, "10.0.0.3", far4, 40000, 9999, ipv4Opts{})(m)[0] }, delivery{}},
		{"udp4 from another MAC", func(m []byte) []byte {
			return eth(brMAC, otherMAC, nil, etIPv4, udpPkt4(far4, 9999)(m))
		}, delivery{}},
		{"a DHCP reply", func(m []byte) []byte { return udp4(brMAC, vm4, far4, 1067, 68, ipv4Opts{})(m)[0] }, delivery{}},
	} {
		marker := []byte(fmt.Sprintf("peer-%s-%s#", mode, c.name))
		s.write(b, c.frame(marker))
		wait := 20 * time.Millisecond
		if c.want.bridge {
			wait = 300 * time.Millisecond
		}
		if got := s.collectUntil(marker, wait, c.want); got.bridge != c.want.bridge || !slices.Equal(got.socks, c.want.socks) {
			b.Fatalf("%s does not enforce the rules: %s reached %+v, want %+v", mode, c.name, got, c.want)
		}
	}
}

// skbContext is a struct __sk_buff (192 bytes) with the ingress ifindex and
// the device set, as BPF_PROG_TEST_RUN reads it.
func skbContext(ifindex uint32) []byte {
	ctx := make([]byte, 192)
	binary.NativeEndian.PutUint32(ctx[36:], ifindex) // ingress_ifindex
	binary.NativeEndian.PutUint32(ctx[40:], ifindex) // ifindex
	return ctx
}

// BenchmarkTapIngress measures the per-frame cost of the TCX program, this
// build's ("after") against the program before issue 21 ("before"), in the
// same run, on the same maps, tap and frames:
//
//   - test-run: BPF_PROG_TEST_RUN, the program alone; ns/run per program;
//   - tap: frames written into the tap's queue as a VMM writes them (the
//     write returns after the kernel's receive path ran, TCX included), with
//     no program, the old one and the new one attached in turn to the same
//     tap; the program's cost is its ns/frame minus the bare tap's.
//
// x-of-before is after's cost over before's: it must stay within 1.3. The
// tap path also measures the nftables peer (nftPeer), the same rules in a
// netdev ingress chain; x-of-nft is after's cost over the peer's. Before
// measuring, the new program and the peer are both shown to enforce the
// rules on marked frames.
func BenchmarkTapIngress(b *testing.B) {
	s := newBenchScene(b)
	s.listen(b)
	// As on a node: the daemon's route watcher publishes the host view.
	s.watchRoutes(b)
	for _, mode := range []string{"after", "nft"} {
		var l link.Link
		if mode == "nft" {
			s.setNFT(b, true)
		} else if err := netns.Do(s.ns.File, func() error {
			var err error
			l, err = link.AttachTCX(link.TCXOptions{Interface: int(s.ifindex), Program: s.progs[mode], Attach: ebpf.AttachTCXIngress})
			return err
		}); err != nil {
			b.Fatal(err)
		}
		s.checkEnforces(b, mode)
		if l != nil {
			l.Close()
		} else {
			s.setNFT(b, false)
		}
	}
	for name, frames := range benchFrames() {
		frame := frames[0]
		b.Run("test-run/"+name, func(b *testing.B) {
			if len(frames) > 1 {
				b.Skip("one frame per test run")
			}
			const repeat = 20000
			ctx := skbContext(s.ifindex)
			progs := []string{"before", "after"}
			var ratios []float64
			per := map[string][]float64{}
			for i := 0; b.Loop(); i++ {
				got := map[string]float64{}
				for j := range progs {
					p := progs[(i+j)%len(progs)]
					// In the tap's namespace: the kernel resolves the
					// context's ifindex, and the program's route lookup
					// runs, in the caller's.
					var took time.Duration
					if err := netns.Do(s.ns.File, func() error {
						start := time.Now()
						_, err := s.progs[p].Run(&ebpf.RunOptions{Data: frame, Context: ctx, Repeat: repeat})
						took = time.Since(start)
						return err
					}); err != nil {
						b.Fatalf("%s: test run: %v", p, err)
					}
					got[p] = float64(took.Nanoseconds()) / repeat
					per[p] = append(per[p], got[p])
				}
				ratios = append(ratios, got["after"]/got["before"])
			}
			b.ReportMetric(median(per["before"]), "before-ns/run")
			b.ReportMetric(median(per["after"]), "after-ns/run")
			b.ReportMetric(median(ratios), "x-of-before")
		})
		b.Run("tap/"+name, func(b *testing.B) {
			// One CPU, as a VM's vCPU thread mostly is: the program's
			// route answers are cached per CPU, and a writer moved
			// between CPUs at the scheduler's whim would measure the
			// scheduler.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var cpu unix.CPUSet
			cpu.Set(0)
			if err := unix.SchedSetaffinity(0, &cpu); err != nil {
				b.Fatal(err)
			}
			const writes = 1024
			modes := []string{"none", "before", "after", "nft"}
			cost := map[string][]float64{}
			var bare []float64
			for i := 0; b.Loop(); i++ {
				got := map[string]float64{}
				for j := range modes {
					// Rotate the order so that no mode always runs first.
					mode := modes[(i+j)%len(modes)]
					var l link.Link
					if mode == "nft" {
						s.setNFT(b, true)
					} else if mode != "none" {
						// The kernel resolves the ifindex in the calling thread's namespace.
						err := netns.Do(s.ns.File, func() error {
							var err error
							l, err = link.AttachTCX(link.TCXOptions{Interface: int(s.ifindex), Program: s.progs[mode], Attach: ebpf.AttachTCXIngress})
							return err
						})
						if err != nil {
							b.Fatalf("attach %s: %v", mode, err)
						}
					}
					start := time.Now()
					for w := range writes {
						s.write(b, frames[(i*writes+w)%len(frames)])
					}
					got[mode] = float64(time.Since(start).Nanoseconds()) / writes
					if l != nil {
						l.Close()
					}
					if mode == "nft" {
						s.setNFT(b, false)
					}
				}
				// Each program's cost is against the bare tap of the same
				// iteration: the machine is shared, and its load drifts.
				bare = append(bare, got["none"])
				for _, m := range []string{"before", "after", "nft"} {
					cost[m] = append(cost[m], got[m]-got["none"])
				}
			}
			b.ReportMetric(median(bare), "bare-ns/frame")
			b.ReportMetric(median(cost["before"]), "before-ns/frame")
			b.ReportMetric(median(cost["after"]), "after-ns/frame")
			b.ReportMetric(median(cost["nft"]), "nft-ns/frame")
			b.ReportMetric(median(cost["after"])/median(cost["before"]), "x-of-before")
			b.ReportMetric(median(cost["after"])/median(cost["nft"]), "x-of-nft")
		})
	}
}

// median of xs (which it sorts).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}
