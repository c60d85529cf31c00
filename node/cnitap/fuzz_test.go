package cnitap

import (
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
)

// FuzzParse feeds arbitrary network configurations and CNI_ARGS to the
// parser: no panic, and an accepted ADD always has a valid identity, the
// container's stamp and a tap configuration for it.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"cniVersion":"1.1.0","name":"g","type":"galactic-tap","vpc":"a","vpcAttachment":"3","table":1010,"routes":["10.0.0.3/32"],"hostOnlyPorts":["udp/53"],"gateway":{"ipv4":"10.0.0.1"}}`), "")
	f.Add([]byte(`{"cniVersion":"1.1.0","table":1}`), "GALACTIC_VPC=a;GALACTIC_VPC_ATTACHMENT=1")
	f.Add([]byte(`{"policy":{"defaultAction":"deny","protocols":[6,17]},"vpc":"1","vpcAttachment":"0"}`), "IgnoreUnknown=1;X=y")
	f.Add([]byte(`{"vpc":"a","vpcAttachment":"3","table":1010,"mac":"02:00:00:00:00:03","runtimeConfig":{"mac":"02:00:00:00:00:04","ips":["10.0.0.3/24","fd00::3"]},"policy":{"allowSpoofing":true}}`), "")
	f.Fuzz(func(t *testing.T, conf []byte, cniArgs string) {
		inv, err := parse(&skel.CmdArgs{ContainerID: "c0ffee", StdinData: conf, Args: cniArgs}, cmdAdd)
		if err != nil {
			return
		}
		if !inv.hasIdentity || !inv.identity.Valid() || inv.tap.Identity != inv.identity || inv.tap.Owner != "c0ffee" || inv.reg.Identity != inv.identity {
			t.Fatalf("accepted %q / %q as %+v", conf, cniArgs, inv)
		}
	})
}
