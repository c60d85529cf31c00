package routewatch_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jsimonetti/rtnetlink/v2"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/node/routewatch"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// view stands in for the datapath's maps: the benchmark measures the
// watcher's side of the window (kernel event to the host view that holds
// it), and the map writes it leaves out are measured by the datapath's
// benchmarks. A fake because those maps need the program loaded, which
// adds nothing here.
type view struct {
	epoch atomic.Uint64
	has   atomic.Bool // the last view published holds watched
}

var watched = netip.MustParsePrefix("10.77.0.1/32")

func (v *view) BumpRouteEpoch() (uint64, error)   { return v.epoch.Add(1), nil }
func (v *view) RevokeHostView() error             { return nil }
func (v *view) RenewHostView(time.Duration) error { return nil }
func (v *view) PublishHostView(ps []netip.Prefix, _ time.Duration) error {
	v.has.Store(slices.Contains(ps, watched))
	return nil
}

// BenchmarkRouteChangeToHostView measures the window that remains after
// issue 29: from an address change returning to its caller to the host
// view the watcher publishes for it (the watcher often wakes before the
// caller does, so the median is near zero; the 99th percentile is the
// figure to watch). Its peer, in the same run, is the change itself: the
// bare rtnetlink call that adds or removes the address.
func BenchmarkRouteChangeToHostView(b *testing.B) {
	ns := nettest.NewNS(b)
	ns.IP(b, "link", "add", "dummy0", "type", "bridge") // any device: this kernel has no dummy module
	ns.IP(b, "link", "set", "dummy0", "up")
	v := &view{}
	w, err := routewatch.Dial(ns.File, v, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
		_ = w.Close()
	}()
	rc, err := rtnetlink.Dial(&netlink.Config{NetNS: int(ns.File.Fd())})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	links, err := rc.Link.List()
	if err != nil {
		b.Fatal(err)
	}
	var index uint32
	for _, l := range links {
		if l.Attributes.Name == "dummy0" {
			index = l.Index
		}
	}
	addr := &rtnetlink.AddressMessage{Family: unix.AF_INET, PrefixLength: 32, Index: index,
		Attributes: &rtnetlink.AddressAttributes{Address: net.IPv4(10, 77, 0, 1).To4(), Local: net.IPv4(10, 77, 0, 1).To4()}}
	var change, window []float64
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		if i%2 == 0 {
			err = rc.Address.New(addr)
		} else {
			err = rc.Address.Delete(addr)
		}
		returned := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		for v.has.Load() != (i%2 == 0) {
		}
		change = append(change, float64(returned.Sub(start).Nanoseconds()))
		window = append(window, float64(time.Since(returned).Nanoseconds()))
	}
	b.ReportMetric(quantile(change, 0.5), "change-ns")
	b.ReportMetric(quantile(window, 0.5), "window-ns")
	b.ReportMetric(quantile(window, 0.99), "window-p99-ns")
	b.ReportMetric(quantile(window, 0.5)/quantile(change, 0.5), "window/change")
}

// quantile is the q-quantile of xs (0.5: the median).
func quantile(xs []float64, q float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}
