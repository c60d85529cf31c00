package datapath_test

import (
	"errors"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/netns"
)

// noMonitorObject is this build's program compiled without the drop
// monitor (GALACTIC_NO_DROP_MONITOR; make generate writes it).
const noMonitorObject = "testdata/nomonitor/nomonitor_bpfel.o"

// loadNoMonitor loads noMonitorObject on the scene's maps, rows and state
// alike, so that both programs judge by the same rules and caches.
func loadNoMonitor(b *testing.B, s *tapScene) *ebpf.Program {
	b.Helper()
	spec, err := ebpf.LoadCollectionSpec(noMonitorObject)
	if err != nil {
		b.Fatal(err)
	}
	repl := s.dp.StateMapsForTest()
	for name := range spec.Maps {
		if t, err := s.dp.Table(name); err == nil {
			repl[name] = t.Map()
		}
	}
	for name := range repl {
		if _, ok := spec.Maps[name]; !ok {
			delete(repl, name)
		}
	}
	// tap_fragments' inner maps are made per interface: not replaced.
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: repl})
	if err != nil {
		b.Fatalf("load %s: %v", noMonitorObject, err)
	}
	b.Cleanup(func() { coll.Close() })
	return coll.Programs["tap_ingress"]
}

// BenchmarkDropMonitor measures what the drop monitor costs, on the tap
// path (frames written into the tap's queue, as a VMM writes them), with
// this build's program ("monitor", a reader draining the ring as the daemon
// does) against the same source compiled without it ("none"), in the same
// run:
//
//   - allowed: a frame the policy allows (no record is written), its cost
//     over the bare tap of the same iteration: x must stay within 1.05;
//   - spoofed: a dropped frame, the tap's budget long spent (what a flood
//     costs per frame), its whole write;
//
// and records-per-second: what a flood of one tap yields in records.
func BenchmarkDropMonitor(b *testing.B) {
	s := newBenchScene(b)
	s.watchRoutes(b)
	progs := map[string]*ebpf.Program{"none": loadNoMonitor(b, s.tapScene), "monitor": s.dp.Program()}
	mon, err := s.dp.OpenDropMonitor()
	if err != nil {
		b.Fatal(err)
	}
	var read atomic.Int64
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			if _, err := mon.Read(); errors.Is(err, os.ErrClosed) {
				return
			}
			read.Add(1)
		}
	}()
	b.Cleanup(func() { _ = mon.Close(); <-drained })

	frames := map[string][]byte{
		"allowed": udp4(brMAC, vm4, far4, 40000, 9999, ipv4Opts{})(nil)[0],
		"spoofed": udp4(brMAC, "10.99.99.99", far4, 40000, 9999, ipv4Opts{})(nil)[0],
	}
	for _, name := range []string{"allowed", "spoofed"} {
		frame := frames[name]
		b.Run("tap/"+name, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var cpu unix.CPUSet
			cpu.Set(0)
			if err := unix.SchedSetaffinity(0, &cpu); err != nil {
				b.Fatal(err)
			}
			const writes = 1024
			modes := []string{"bare", "none", "monitor"}
			cost := map[string][]float64{}
			for i := 0; b.Loop(); i++ {
				got := map[string]float64{}
				for j := range modes {
					mode := modes[(i+j)%len(modes)]
					var l link.Link
					if mode != "bare" {
						if err := netns.Do(s.ns.File, func() (err error) {
							l, err = link.AttachTCX(link.TCXOptions{Interface: int(s.ifindex), Program: progs[mode], Attach: ebpf.AttachTCXIngress})
							return err
						}); err != nil {
							b.Fatal(err)
						}
					}
					start := time.Now()
					for range writes {
						s.write(b, frame)
					}
					got[mode] = float64(time.Since(start).Nanoseconds()) / writes
					if l != nil {
						l.Close()
					}
				}
				// An allowed frame's cost is over the bare tap's, which
				// carries it on to the bridge too; a dropped frame saves
				// that, so its whole write is compared.
				for _, m := range []string{"none", "monitor"} {
					if name == "allowed" {
						cost[m] = append(cost[m], got[m]-got["bare"])
					} else {
						cost[m] = append(cost[m], got[m])
					}
				}
				cost["bare"] = append(cost["bare"], got["bare"])
			}
			b.ReportMetric(median(cost["bare"]), "bare-ns/frame")
			b.ReportMetric(median(cost["none"]), "none-ns/frame")
			b.ReportMetric(median(cost["monitor"]), "monitor-ns/frame")
			b.ReportMetric(median(cost["monitor"])/median(cost["none"]), "x-of-none")
		})
	}
	b.Run("flood", func(b *testing.B) {
		err := netns.Do(s.ns.File, func() error {
			l, err := link.AttachTCX(link.TCXOptions{Interface: int(s.ifindex), Program: progs["monitor"], Attach: ebpf.AttachTCXIngress})
			if err != nil {
				return err
			}
			b.Cleanup(func() { l.Close() })
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		var frames, seconds float64
		before := read.Load()
		for b.Loop() {
			start := time.Now()
			for time.Since(start) < time.Second {
				for range 256 {
					s.write(b, floodFrame)
				}
				frames += 256
			}
			seconds += time.Since(start).Seconds()
		}
		time.Sleep(100 * time.Millisecond) // the reader drains the last
		b.ReportMetric(float64(read.Load()-before)/seconds, "records/s")
		b.ReportMetric(frames/seconds, "frames/s")
		b.ReportMetric(float64(monitorMemory(s.dp))/(1<<10), "monitor-KiB")
	})
}

// floodFrame is the flood's frame: from another address, dropped.
var floodFrame = udp4(brMAC, "10.99.99.99", far4, 40000, 9999, ipv4Opts{})(nil)[0]

// monitorMemory is what the monitor's maps hold at most: the ring, the
// budgets (key, value and the hash's per-element overhead of about 48
// bytes) and the per-CPU lost counters.
func monitorMemory(*datapath.Datapath) int {
	budgets := datapath.DropBudgetsForTest * (4 + 16 + 48)
	lost := 2 * 8 * runtime.NumCPU()
	return datapath.DropRingBytes + budgets + lost
}

// BenchmarkRouteLookupWithoutTheDaemon measures what a frame to a host
// destination (udp/53 of another address of the VRF, which the route
// lookup decides)
// costs the program while the daemon's host view is trusted (cached
// answers) and once it lapsed (a fresh lookup per frame, issue 49), with
// BPF_PROG_TEST_RUN in the same run.
func BenchmarkRouteLookupWithoutTheDaemon(b *testing.B) {
	s := newBenchScene(b)
	frame := udp4(brMAC, vm4, local4, 40000, 53, ipv4Opts{})(nil)[0]
	view := []netip.Prefix{netip.MustParsePrefix(gw4 + "/32"), netip.MustParsePrefix(local4 + "/32"), netip.MustParsePrefix(bcast4 + "/32")}
	ctx := skbContext(s.ifindex)
	const repeat = 20000
	per := map[string][]float64{}
	var ratios []float64
	for i := 0; b.Loop(); i++ {
		got := map[string]float64{}
		for j := range 2 {
			mode := []string{"view", "no-view"}[(i+j)%2]
			var err error
			if mode == "view" {
				err = s.dp.PublishHostView(view, time.Hour)
			} else {
				err = s.dp.RevokeHostView()
			}
			if err != nil {
				b.Fatal(err)
			}
			var took time.Duration
			if err := netns.Do(s.ns.File, func() error {
				start := time.Now()
				_, err := s.dp.Program().Run(&ebpf.RunOptions{Data: frame, Context: ctx, Repeat: repeat})
				took = time.Since(start)
				return err
			}); err != nil {
				b.Fatal(err)
			}
			got[mode] = float64(took.Nanoseconds()) / repeat
			per[mode] = append(per[mode], got[mode])
		}
		ratios = append(ratios, got["no-view"]/got["view"])
	}
	b.ReportMetric(median(per["view"]), "view-ns/run")
	b.ReportMetric(median(per["no-view"]), "no-view-ns/run")
	b.ReportMetric(median(ratios), "x-of-view")
}
