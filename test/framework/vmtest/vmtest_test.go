package vmtest_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/netns"
	"github.com/datum-cloud/galactic-node/node/tun"
	"github.com/datum-cloud/galactic-node/test/framework/nettest"
	"github.com/datum-cloud/galactic-node/test/framework/vmtest"
)

// bootTimeout bounds the guest's run from QEMU's start to GALACTIC-DONE:
// 10 s on an idle machine under TCG, up to 45 s beside busy CPUs.
const bootTimeout = 180 * time.Second

// tapHeld reports whether a single-queue tap is held, as the kernel sees it:
// a second attach fails with EBUSY while another file has the one queue. A
// successful attach is closed at once, giving the queue back.
func tapHeld(t *testing.T, ns *nettest.NS, name string) bool {
	t.Helper()
	f, err := tun.Open(ns.File, name, tun.Mode{SingleQueue: true})
	if errors.Is(err, syscall.EBUSY) {
		return true
	}
	if err != nil {
		t.Fatalf("probe tap %s: %v", name, err)
	}
	f.Close()
	return false
}

var queuesRE = regexp.MustCompile(`numqueues (\d+) numdisabled (\d+)`)

// queues returns the attached queues of a multiqueue tap that `ip -d link
// show` reports: enabled and disabled ones ("1+1").
func queues(t *testing.T, ns *nettest.NS, name string) string {
	t.Helper()
	out := ns.IP(t, "-d", "link", "show", name)
	m := queuesRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no numqueues and numdisabled for %s in:\n%s", name, out)
	}
	return m[1] + "+" + m[2]
}

// The guest boots on a tap QEMU opened by name, and reaches a bridge in the
// tap's namespace: ARP, ICMP and UDP to a socket the test listens on.
func TestGuestReachesTheBridgeThroughItsTap(t *testing.T) {
	nettest.RequirePrivileged(t)
	ns := nettest.NewNS(t)
	const tap = "vmtap0"
	nettest.NewTap(t, ns, tap, tun.Mode{SingleQueue: true})
	ns.IP(t, "link", "add", "br0", "type", "bridge")
	ns.IP(t, "addr", "add", "10.10.0.254/24", "dev", "br0")
	ns.IP(t, "link", "set", "br0", "up")
	ns.IP(t, "link", "set", tap, "master", "br0")
	ns.IP(t, "link", "set", tap, "up")

	// A socket belongs to the namespace it was made in, whichever thread
	// reads it later.
	var conn net.PacketConn
	if err := netns.Do(ns.File, func() error {
		var err error
		conn, err = net.ListenPacket("udp4", "10.10.0.254:9999")
		return err
	}); err != nil {
		t.Fatalf("listen on 10.10.0.254:9999 in %s: %v", ns.Name, err)
	}
	defer func() { _ = conn.Close() }()
	datagrams := make(chan string, 16)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				close(datagrams)
				return
			}
			datagrams <- string(buf[:n])
		}
	}()

	start := time.Now()
	vm := vmtest.Start(t, vmtest.Options{
		NetNS:   ns.Name,
		Boot:    true,
		Netdevs: []string{"tap,id=n0,ifname=" + tap + ",script=no,downscript=no,vhost=off"},
		Devices: []string{"virtio-net-pci,netdev=n0,id=nic0,mac=52:54:00:00:00:03"},
		Append:  "galactic.ip=10.10.0.3/24 galactic.gw=10.10.0.254 galactic.udp=10.10.0.254:9999",
	})
	if !tapHeld(t, ns, tap) {
		t.Fatalf("tap %s not held by QEMU %d after Start", tap, vm.PID())
	}
	vm.WaitConsole(t, "GALACTIC-DONE", bootTimeout)
	t.Logf("guest done %s after QEMU's start", time.Since(start).Round(time.Second))
	console := vm.Console()
	for _, marker := range []string{"GALACTIC-UP eth0 10.10.0.3/24 52:54:00:00:00:03", "GALACTIC-ARP-OK", "GALACTIC-PING-OK", "GALACTIC-UDP-SENT"} {
		if !strings.Contains(console, marker) {
			t.Errorf("no %q on the console:\n%s", marker, console)
		}
	}
	select {
	case d, ok := <-datagrams:
		if !ok {
			t.Fatal("UDP socket closed before a datagram came")
		}
		if !strings.Contains(d, "galactic-udp") {
			t.Errorf("datagram %q: want the guest's galactic-udp message", d)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no UDP datagram from the guest at 10.10.0.254:9999")
	}

	// A booted guest ejects a NIC on device_del (ACPI hot-plug), which
	// QEMU confirms with DEVICE_DELETED; netdev_del then closes the tap.
	q := vm.QMP()
	if _, err := q.Execute("device_del", map[string]string{"id": "nic0"}); err != nil {
		t.Fatal(err)
	}
	if err := q.WaitDeviceDeleted("nic0", 60*time.Second); err != nil {
		t.Fatalf("guest did not eject nic0: %v", err)
	}
	if pciDevice(t, q, "nic0") {
		t.Fatal("nic0 still on the PCI bus after DEVICE_DELETED")
	}
	if !tapHeld(t, ns, tap) {
		t.Fatalf("tap %s released by device_del alone; the netdev should still hold it", tap)
	}
	if _, err := q.Execute("netdev_del", map[string]string{"id": "n0"}); err != nil {
		t.Fatal(err)
	}
	if tapHeld(t, ns, tap) {
		t.Fatalf("tap %s still held after netdev_del", tap)
	}
	vm.Quit(t)
}

// A paused, guest-less QEMU holds both queues of a multiqueue tap opened by
// name with queues=2 until it exits. The kernel counts one of them disabled:
// virtio-net detaches the queues beyond the first (TUNSETQUEUE) until a
// guest driver turns multiqueue on, so numqueues alone says 1.
func TestUnbootedVMHoldsAMultiqueueTap(t *testing.T) {
	nettest.RequirePrivileged(t)
	ns := nettest.NewNS(t)
	const tap = "vmmq0"
	nettest.NewTap(t, ns, tap, tun.Mode{})
	if n := queues(t, ns, tap); n != "0+0" {
		t.Fatalf("new tap %s has queues %s, want 0+0", tap, n)
	}
	vm := vmtest.Start(t, vmtest.Options{
		NetNS:   ns.Name,
		Netdevs: []string{"tap,id=n0,ifname=" + tap + ",queues=2,script=no,downscript=no,vhost=off"},
		Devices: []string{"virtio-net-pci,netdev=n0,mq=on,vectors=6,mac=52:54:00:00:00:05"},
	})
	if n := queues(t, ns, tap); n != "1+1" {
		t.Fatalf("tap %s has queues %s (enabled+disabled) with QEMU %d holding it, want 1+1", tap, n, vm.PID())
	}
	vm.Quit(t)
	if n := queues(t, ns, tap); n != "0+0" {
		t.Fatalf("tap %s has queues %s after QEMU quit, want 0+0", tap, n)
	}
}

// A descriptor in Options.Files is QEMU's fd 3: netdev fd=3 holds the tap
// after the test closes its own copy.
func TestUnbootedVMHoldsAnInheritedTapFD(t *testing.T) {
	nettest.RequirePrivileged(t)
	ns := nettest.NewNS(t)
	const tap = "vmfd0"
	nettest.NewTap(t, ns, tap, tun.Mode{SingleQueue: true})
	f, err := tun.Open(ns.File, tap, tun.Mode{SingleQueue: true})
	if err != nil {
		t.Fatal(err)
	}
	vm := vmtest.Start(t, vmtest.Options{
		Netdevs: []string{"tap,id=n0,fd=3,vhost=off"},
		Devices: []string{"virtio-net-pci,netdev=n0,mac=52:54:00:00:00:06"},
		Files:   []*os.File{f},
	})
	f.Close()
	if !tapHeld(t, ns, tap) {
		t.Fatalf("tap %s not held by QEMU %d through fd 3", tap, vm.PID())
	}
	vm.Kill()
	if tapHeld(t, ns, tap) {
		t.Fatalf("tap %s still held after QEMU was killed", tap)
	}
}

// libvirt's way, on a paused guest-less QEMU: getfd sends the tap's
// descriptor over QMP, netdev_add and device_add plug it, device_del and
// netdev_del unplug it. Without a guest to eject the NIC, device_del only
// requests the unplug (no DEVICE_DELETED comes); netdev_del is what closes
// the tap.
func TestQMPGetFDHotplugRoundTrip(t *testing.T) {
	nettest.RequirePrivileged(t)
	ns := nettest.NewNS(t)
	const tap = "vmqmp0"
	nettest.NewTap(t, ns, tap, tun.Mode{SingleQueue: true})
	vm := vmtest.Start(t, vmtest.Options{NetNS: ns.Name})
	q := vm.QMP()

	f, err := tun.Open(ns.File, tap, tun.Mode{SingleQueue: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.GetFD("tapfd", f); err != nil {
		f.Close()
		t.Fatal(err)
	}
	f.Close()
	if !tapHeld(t, ns, tap) {
		t.Fatalf("tap %s not held by QEMU %d after getfd", tap, vm.PID())
	}

	if _, err := q.Execute("netdev_add", map[string]any{"type": "tap", "id": "hn0", "fd": "tapfd", "vhost": false}); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Execute("device_add", map[string]string{"driver": "virtio-net-pci", "netdev": "hn0", "id": "hnic0", "mac": "52:54:00:00:00:04"}); err != nil {
		t.Fatal(err)
	}
	if !pciDevice(t, q, "hnic0") {
		t.Fatal("hnic0 not on the PCI bus after device_add")
	}
	if !tapHeld(t, ns, tap) {
		t.Fatalf("tap %s not held with hn0 plugged", tap)
	}
	if _, err := q.Execute("device_del", map[string]string{"id": "hnic0"}); err != nil {
		t.Fatal(err)
	}
	if pciDevice(t, q, "hnic0") {
		t.Log("hnic0 stays on the bus after device_del: no guest ejects it")
	}
	if !tapHeld(t, ns, tap) {
		t.Fatalf("tap %s released by device_del alone; the netdev should still hold it", tap)
	}
	if _, err := q.Execute("netdev_del", map[string]string{"id": "hn0"}); err != nil {
		t.Fatal(err)
	}
	if tapHeld(t, ns, tap) {
		t.Fatalf("tap %s still held after netdev_del", tap)
	}
	vm.Quit(t)
}

// pciDevice reports whether query-pci lists a device with qdev id.
func pciDevice(t *testing.T, q *vmtest.QMP, id string) bool {
	t.Helper()
	raw, err := q.Execute("query-pci", nil)
	if err != nil {
		t.Fatal(err)
	}
	var buses []struct {
		Devices []struct {
			QdevID string `json:"qdev_id"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(raw, &buses); err != nil {
		t.Fatalf("query-pci %s: %v", raw, err)
	}
	for _, b := range buses {
		for _, d := range b.Devices {
			if d.QdevID == id {
				return true
			}
		}
	}
	return false
}

// fatalTB is a testing.TB whose Fatal ends only the goroutine it runs on,
// keeping the message, so that a test can see Start fail.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}

// A QEMU that exits at start fails the test with QEMU's own error.
func TestStartFailsWithQEMUsError(t *testing.T) {
	// Start would skip on the fake's goroutine, where t cannot.
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil && os.Getenv("CI") != "true" {
		t.Skipf("needs qemu-system-x86_64: %v", err)
	}
	fake := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		vmtest.Start(fake, vmtest.Options{Devices: []string{"no-such-device"}})
	}()
	<-done
	if !strings.Contains(fake.msg, "no-such-device") || !strings.Contains(fake.msg, "not a valid device model name") {
		t.Fatalf("Start failed with %q: want QEMU's complaint about no-such-device", fake.msg)
	}
	t.Log(fake.msg)
}
