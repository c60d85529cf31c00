package cnitap

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
)

// TestTheAttachmentsMACAndAddressesReachItsRegistration: anti-spoofing binds
// an attachment to what its configuration says is its own: the routes, the
// "ips" capability's addresses (each alone, not its subnet), and the MAC,
// the "mac" capability's winning over the configuration's.
func TestTheAttachmentsMACAndAddressesReachItsRegistration(t *testing.T) {
	conf := `{"cniVersion":"1.1.0","name":"g","type":"galactic-tap","vpc":"a","vpcAttachment":"3","table":1010,
		"routes":["10.10.0.3/32"],"mac":"02:00:00:00:00:03",
		"runtimeConfig":{"mac":"02:00:00:00:00:04","ips":["10.0.0.3/24","fd00::3"]}}`
	inv, err := parse(&skel.CmdArgs{ContainerID: "c0ffee", StdinData: []byte(conf)}, cmdAdd)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := net.ParseMAC("02:00:00:00:00:04"); inv.reg.MAC.String() != want.String() {
		t.Errorf("mac %v, want the capability's %v", inv.reg.MAC, want)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.10.0.3/32"), netip.MustParsePrefix("10.0.0.3/32"), netip.MustParsePrefix("fd00::3/128")}
	if !slices.Equal(inv.reg.Addresses, want) {
		t.Errorf("addresses %v, want %v", inv.reg.Addresses, want)
	}
	if inv.reg.Policy.AllowSpoofing {
		t.Error("anti-spoofing is off by default")
	}
}
