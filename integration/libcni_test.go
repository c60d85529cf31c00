package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/netns"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// tuningVersion is the stock containernetworking plugins release chained
// after galactic-tap, built from the Go module proxy.
const tuningVersion = "v1.10.0"

var (
	stockOnce sync.Once
	stockDir  string
	stockErr  error
)

// stockPlugins builds the stock tuning, bridge and host-local plugins once
// per test binary: static (no cgo), as upstream's release builds them, so
// the peer's every exec, like galactic-tap's, loads no shared libraries,
// and stripped, as the image's galactic-tap is. They go in a folder of
// binDir, which TestMain removes when the binary ends.
func stockPlugins(t testing.TB) string {
	t.Helper()
	stockOnce.Do(func() {
		stockDir, stockErr = os.MkdirTemp(binDir, "galactic-stock-cni-")
		if stockErr != nil {
			stockErr = fmt.Errorf("make the stock plugins' folder: %w", stockErr)
			return
		}
		cmd := exec.Command("go", "install", "-trimpath", "-ldflags=-s -w",
			"github.com/containernetworking/plugins/plugins/meta/tuning@"+tuningVersion,
			"github.com/containernetworking/plugins/plugins/main/bridge@"+tuningVersion,
			"github.com/containernetworking/plugins/plugins/ipam/host-local@"+tuningVersion)
		cmd.Env = append(os.Environ(), "GOBIN="+stockDir, "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
		cmd.Dir = stockDir
		if out, err := cmd.CombinedOutput(); err != nil {
			stockErr = fmt.Errorf("build the stock plugins %s: %w: %s", tuningVersion, err, out)
		}
	})
	if stockErr != nil {
		t.Fatal(stockErr)
	}
	return stockDir
}

// runtime drives the built plugin the way containerd's go-cni and CRI-O's
// ocicni do: through libcni, with its result cache, from the host's
// network namespace.
type runtime struct {
	h     *cniHost
	cni   *libcni.CNIConfig
	cache string
}

func newRuntime(t testing.TB, h *cniHost) *runtime {
	t.Helper()
	bin := t.TempDir()
	if err := os.Symlink(tapPlugin, filepath.Join(bin, "galactic-tap")); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	// The plugins' logs go to the test's log, not the benchmark's output.
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: testLog{t}}}
	return &runtime{h: h, cache: cache, cni: libcni.NewCNIConfigWithCacheDir([]string{bin, stockPlugins(t)}, cache, exec)}
}

// testLog writes to a test's log, shown with -v or when it fails.
type testLog struct{ tb testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// in runs fn with the calling thread in the host namespace: the plugins
// libcni executes inherit it.
func (r *runtime) in(fn func(ctx context.Context) error) error {
	return netns.Do(r.h.host.File, func() error { return fn(context.Background()) })
}

// list builds a conflist of galactic-tap for attachment att, at version,
// named name, followed by extra plugins.
func (r *runtime) list(version, name, att string, extra ...map[string]any) *libcni.NetworkConfigList {
	r.h.t.Helper()
	return r.listConf(version, name, att, nil, extra...)
}

// listConf is list with conf's keys set in galactic-tap's configuration.
func (r *runtime) listConf(version, name, att string, conf map[string]any, extra ...map[string]any) *libcni.NetworkConfigList {
	r.h.t.Helper()
	var tapConf map[string]any
	if err := json.Unmarshal(r.h.conf(att, conf), &tapConf); err != nil {
		r.h.t.Fatal(err)
	}
	delete(tapConf, "cniVersion")
	delete(tapConf, "name")
	plugins := append([]any{tapConf}, anys(extra)...)
	b, _ := json.Marshal(map[string]any{"cniVersion": version, "name": name, "plugins": plugins})
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		r.h.t.Fatal(err)
	}
	return l
}

func anys(ms []map[string]any) []any {
	out := make([]any, len(ms))
	for i, m := range ms {
		out[i] = m
	}
	return out
}

func (r *runtime) rt(container, ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: container, NetNS: "/run/netns/" + r.h.ctr.Name, IfName: ifName}
}

// TestLibcniDrivesEveryVerb runs ADD, CHECK, STATUS, VALIDATE, GC and DEL
// through libcni at CNI 1.0.0 and 1.1.0; the 1.1.0 list chains the stock
// tuning plugin, which sets a sysctl in the container's namespace.
func TestLibcniDrivesEveryVerb(t *testing.T) {
	for _, version := range []string{"1.0.0", "1.1.0"} {
		t.Run(version, func(t *testing.T) {
			h := newCNIHost(t)
			r := newRuntime(t, h)
			var extra []map[string]any
			if version == "1.1.0" {
				extra = append(extra, map[string]any{"type": "tuning", "sysctl": map[string]string{"net.core.somaxconn": "777"}})
				// tuning's CHECK reads CNI_IFNAME in the container; the tap
				// lives on the host, so the container gets a stand-in.
				h.ctr.IP(t, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0p")
			}
			list := r.list(version, "galactic", "c", extra...)
			rt := r.rt(ctrA, "eth0")
			err := r.in(func(ctx context.Context) error {
				if _, err := r.cni.ValidateNetworkList(ctx, list); err != nil {
					return fmt.Errorf("validate: %w", err)
				}
				if version == "1.1.0" {
					if err := r.cni.GetStatusNetworkList(ctx, list); err != nil {
						return fmt.Errorf("status: %w", err)
					}
				}
				res, err := r.cni.AddNetworkList(ctx, list, rt)
				if err != nil {
					return fmt.Errorf("add: %w", err)
				}
				if b, _ := json.Marshal(res); !strings.Contains(string(b), tapName("c")) {
					return fmt.Errorf("add result %s does not name the tap", b)
				}
				if err := r.cni.CheckNetworkList(ctx, list, rt); err != nil {
					return fmt.Errorf("check: %w", err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if version == "1.1.0" {
				if got := strings.TrimSpace(nettest.Run(t, "ip", "netns", "exec", h.ctr.Name, "sysctl", "-n", "net.core.somaxconn")); got != "777" {
					t.Fatalf("the chained tuning plugin did not run: somaxconn %s", got)
				}
			}
			l, _ := h.link(tapName("c"))
			err = r.in(func(ctx context.Context) error {
				if version == "1.1.0" {
					if err := r.cni.GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: ctrA, IfName: "eth0"}}}); err != nil {
						return fmt.Errorf("gc: %w", err)
					}
				}
				return r.cni.DelNetworkList(ctx, list, rt)
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := h.link(tapName("c")); ok || len(h.rows(l.Index)) != 0 {
				t.Fatalf("after DEL: tap present %v, rows %v", ok, h.rows(l.Index))
			}
		})
	}
}

// GC of one network touches only the taps that network's ADD made: another
// network's tap (a second attachment of the same runtime, Multus-style)
// stays, and a GC that lists no valid attachments at all, as cnitool sends
// it, removes nothing.
func TestGCOfOneNetworkLeavesAnotherNetworksTaps(t *testing.T) {
	h := newCNIHost(t)
	r := newRuntime(t, h)
	netN, netW := r.list("1.1.0", "net-n", "5"), r.list("1.1.0", "net-w", "6")
	x, y := strings.Repeat("1", 64), strings.Repeat("2", 64)
	err := r.in(func(ctx context.Context) error {
		if _, err := r.cni.AddNetworkList(ctx, netN, r.rt(x, "eth0")); err != nil {
			return err
		}
		if _, err := r.cni.AddNetworkList(ctx, netW, r.rt(y, "net1")); err != nil {
			return err
		}
		return r.cni.GCNetworkList(ctx, netN, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: x, IfName: "eth0"}}})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, att := range []string{"5", "6"} {
		if _, ok := h.link(tapName(att)); !ok {
			t.Fatalf("GC of net-n removed %s", tapName(att))
		}
	}
	noList := h.conf("", map[string]any{"name": "net-w", "vpc": "", "vpcAttachment": ""})
	h.mustCNI("GC", "", noList)
	if _, ok := h.link(tapName("6")); !ok {
		t.Fatal("a GC with no valid-attachments key removed a tap")
	}
	// net-w's own GC, with its attachment gone from the list, removes it.
	withEmpty := h.conf("", map[string]any{"name": "net-w", "vpc": "", "vpcAttachment": "", "cni.dev/valid-attachments": []any{}})
	h.mustCNI("GC", "", withEmpty)
	if _, ok := h.link(tapName("6")); ok {
		t.Fatal("net-w's GC left its stale tap")
	}
	if _, ok := h.link(tapName("5")); !ok {
		t.Fatal("net-w's GC removed net-n's tap")
	}
}

// CHECK verifies everything ADD set up and names the first difference.
func TestCheckNamesEveryDrift(t *testing.T) {
	for _, drift := range []struct {
		name, want string
		do         func(h *cniHost, tap string)
	}{
		{"route deleted", "route", func(h *cniHost, tap string) {
			h.host.IP(h.t, "route", "del", strings.TrimSuffix(routesOf("d")[0], "/32"), "table", "1010")
		}},
		{"down", "down", func(h *cniHost, tap string) { h.host.IP(h.t, "link", "set", tap, "down") }},
		{"mtu", "MTU", func(h *cniHost, tap string) { h.host.IP(h.t, "link", "set", tap, "mtu", "1300") }},
		{"mac", "MAC", func(h *cniHost, tap string) { h.host.IP(h.t, "link", "set", tap, "address", "02:00:00:00:00:99") }},
		{"policy row", "traffic_policy", func(h *cniHost, tap string) {
			l, _ := h.link(tap)
			if err := datapathTables(h).TrafficPolicy.Delete(l.Index); err != nil {
				h.t.Fatal(err)
			}
		}},
	} {
		t.Run(drift.name, func(t *testing.T) {
			h := newCNIHost(t)
			r := newRuntime(t, h)
			var tapConf map[string]any
			_ = json.Unmarshal(h.conf("d", map[string]any{"mtu": 1400}), &tapConf)
			b, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "galactic", "plugins": []any{tapConf}})
			list, err := libcni.ConfListFromBytes(b)
			if err != nil {
				t.Fatal(err)
			}
			rt := r.rt(ctrA, "eth0")
			if err := r.in(func(ctx context.Context) error { _, err := r.cni.AddNetworkList(ctx, list, rt); return err }); err != nil {
				t.Fatal(err)
			}
			drift.do(h, tapName("d"))
			err = r.in(func(ctx context.Context) error { return r.cni.CheckNetworkList(ctx, list, rt) })
			if err == nil || !strings.Contains(err.Error(), drift.want) {
				t.Fatalf("CHECK after %s: %v, want an error naming %s", drift.name, err, drift.want)
			}
		})
	}
}

// Every field is validated before anything changes (error 7), and DEL gets
// through a field it does not use, or the runtime would retry it forever.
func TestBadFieldsAreRefusedUpFrontAndDelStillWorks(t *testing.T) {
	h := newCNIHost(t)
	for name, conf := range map[string][]byte{
		"table 0": h.conf("e", map[string]any{"table": 0}),
		"mtu 10":  h.conf("e", map[string]any{"mtu": 10}),
	} {
		_, err := h.cni("ADD", ctrA, conf)
		if err == nil || !strings.Contains(err.Error(), "code 7") {
			t.Errorf("%s: %v, want error 7", name, err)
		}
		if links, _ := h.host.Dial(t).Links(context.Background()); len(links) != 1 {
			t.Errorf("%s: %d links after a refused ADD, want only lo", name, len(links))
		}
	}
	h.mustCNI("ADD", ctrA, h.conf("e", nil))
	h.mustCNI("DEL", ctrA, h.conf("e", map[string]any{"routes": []string{"not-a-route"}}))
	if _, ok := h.link(tapName("e")); ok {
		t.Fatal("DEL with a broken routes entry left the tap")
	}
}

// STATUS only checks: it creates no lock folder and mounts nothing, and it
// answers 50 until the daemon's pins exist at the configured bpffs. ADD
// never mounts a bpffs either.
func TestStatusOnlyChecks(t *testing.T) {
	h := newCNIHost(t)
	missingLocks := filepath.Join(t.TempDir(), "no-locks")
	if _, err := h.cni("STATUS", "", h.conf("f", map[string]any{"vrfLockDir": missingLocks})); err == nil || !strings.Contains(err.Error(), "code 50") {
		t.Fatalf("STATUS with a missing lock folder: %v, want 50", err)
	}
	if _, err := os.Stat(missingLocks); err == nil {
		t.Fatal("STATUS created the lock folder")
	}
	typo := filepath.Join(t.TempDir(), "bpf-typo")
	for _, cmd := range []string{"STATUS", "ADD"} {
		if _, err := h.cni(cmd, ctrA, h.conf("f", map[string]any{"bpffs": typo})); err == nil || !strings.Contains(err.Error(), "code 50") {
			t.Fatalf("%s with a bpffs typo: %v, want 50", cmd, err)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if _, err := os.Stat(typo); err == nil || strings.Contains(string(mounts), typo) {
		t.Fatal("a bpffs typo was created or mounted")
	}
	if links, _ := h.host.Dial(t).Links(context.Background()); len(links) != 1 {
		t.Fatalf("ADD with a bpffs typo made %d links", len(links)-1)
	}
	fresh := nettest.BPFFS(t) // a bpffs the daemon never pinned into
	if _, err := h.cni("STATUS", "", h.conf("f", map[string]any{"bpffs": fresh})); err == nil || !strings.Contains(err.Error(), "code 50") {
		t.Fatalf("STATUS before the daemon's pins exist: %v, want 50", err)
	}
	h.mustCNI("STATUS", "", h.conf("f", nil))
}

// The conflist deploy/ ships names the network GC is scoped to, parses
// with libcni, and validates against the built plugin.
func TestTheShippedConflistIsAValidNetwork(t *testing.T) {
	b, err := os.ReadFile("../deploy/node/10-galactic.conflist")
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	if list.Name != "galactic" || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "galactic-tap" {
		t.Fatalf("conflist: name %q, plugins %d", list.Name, len(list.Plugins))
	}
	bin := t.TempDir()
	if err := os.Symlink(tapPlugin, filepath.Join(bin, "galactic-tap")); err != nil {
		t.Fatal(err)
	}
	if _, err := libcni.NewCNIConfig([]string{bin}, nil).ValidateNetworkList(context.Background(), list); err != nil {
		t.Fatalf("validate the shipped conflist: %v", err)
	}
	// That the DaemonSet installs it, and that the plugin it installs
	// runs it: TestTheNodeImageRunsAsTheDaemonSetRunsIt.
}

// BenchmarkLibcniAddDel times ADD and DEL of galactic-tap through libcni,
// as containerd's go-cni calls it, against the reference bridge+host-local
// conflist in the same run, host namespace, libcni cache and container
// namespace. ns/op is one galactic ADD plus its DEL; x-of-bridge compares
// each verb's wall time, cpu-x-of-bridge its plugins' CPU time, with the
// peer's; first-add-ns is the first ADD after the daemon's pins exist, as
// after an upgrade, which verifies the program. What makes the comparison
// fair (warm-up, static builds, one disk, alternating order, the load
// beside it): benchAddDel.
func BenchmarkLibcniAddDel(b *testing.B) {
	h := newCNIHost(b)
	r := newRuntime(b, h)
	// Under the test's TempDir, as galactic's records (h.dataDir) are: one
	// filesystem for both stores, which benchAddDel checks.
	ipam := filepath.Join(b.TempDir(), "host-local")
	galactic := addDelSide{r: r, list: r.list("1.1.0", "galactic", "f"), store: h.dataDir,
		rt: func(i int) *libcni.RuntimeConf { return r.rt(fmt.Sprintf("%064x", i), "eth0") }}
	peer := addDelSide{r: r, store: ipam,
		list: benchConfList(b, "peer", map[string]any{"type": "bridge", "bridge": "cnibr0", "isGateway": true,
			"ipam": map[string]any{"type": "host-local", "subnet": "10.99.0.0/16", "dataDir": ipam}}),
		rt: func(i int) *libcni.RuntimeConf { return r.rt(fmt.Sprintf("%064x", i+1<<32), "eth0") }}
	// No ADD has run over the pins yet: the warm-up is the first after an
	// upgrade, which loads this build's program and pins it.
	if _, err := os.Stat(filepath.Join(h.bpffs, datapath.PinSubdir, datapath.ProgramsSubdir, datapath.ProgramName())); !errors.Is(err, os.ErrNotExist) {
		b.Fatalf("the program is pinned before the first ADD (%v): the first ADD would not load it", err)
	}
	benchAddDel(b, galactic, peer, true)
}

// A DEL with no identity (the runtime passes none) removes only what this
// network's ADD recorded for the attachment, never the same container's tap
// of another network.
func TestADelWithoutIdentityStaysInItsNetwork(t *testing.T) {
	h := newCNIHost(t)
	x := strings.Repeat("7", 64)
	h.mustCNI("ADD", x, h.conf("g", map[string]any{"name": "net-n"}))
	h.mustCNI("ADD", x, h.conf("h", map[string]any{"name": "net-w"}))
	h.mustCNI("DEL", x, h.conf("", map[string]any{"name": "net-n", "vpc": "", "vpcAttachment": ""}))
	if _, ok := h.link(tapName("g")); ok {
		t.Fatal("DEL left its own network's tap")
	}
	if _, ok := h.link(tapName("h")); !ok {
		t.Fatal("DEL of net-n removed net-w's tap of the same container")
	}
}
