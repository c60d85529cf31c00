package datapath_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
)

// readmePolicy reads the policy of the CNI configuration example in the
// README, as an operator would copy it.
func readmePolicy(t *testing.T) datapath.Policy {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Type   string `json:"type"`
		Policy struct {
			DefaultAction string   `json:"defaultAction"`
			Ethertypes    []uint16 `json:"ethertypes"`
			Protocols     []uint8  `json:"protocols"`
		} `json:"policy"`
	}
	for _, block := range strings.Split(string(b), "```json")[1:] {
		block, _, _ = strings.Cut(block, "```")
		if err := json.Unmarshal([]byte(block), &conf); err == nil && conf.Type == "galactic-tap" {
			p := datapath.Policy{Generation: 1, Ethertypes: conf.Policy.Ethertypes}
			if err := p.DefaultAction.UnmarshalText([]byte(conf.Policy.DefaultAction)); err != nil {
				t.Fatal(err)
			}
			for _, proto := range conf.Policy.Protocols {
				p.Protocols = append(p.Protocols, datapath.Protocol(proto))
			}
			return p
		}
	}
	t.Fatal("README.md has no galactic-tap configuration example")
	return datapath.Policy{}
}

// readReply reads frames from the VMM's queue until match accepts one or a
// second passes.
func (s *tapScene) readReply(match func([]byte) bool) bool {
	buf := make([]byte, 2048)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		n, err := unix.Read(s.q, buf)
		if err != nil {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if match(buf[:n]) {
			return true
		}
	}
	return false
}

// Issue 21, case 7: a VM under the README's example policy, or under a
// default-deny policy, resolves its gateway: the host answers its ARP
// request and its neighbor solicitation through the tap.
func TestTheVMResolvesItsGateway(t *testing.T) {
	s := newTapScene(t, tenant{VPC: 62, Attachment: 75})
	for _, p := range []struct {
		name   string
		policy datapath.Policy
	}{
		{"allow", datapath.Policy{Generation: 1, DefaultAction: datapath.ActionAllow}},
		{"readme", readmePolicy(t)},
		{"deny", datapath.Policy{Generation: 3, DefaultAction: datapath.ActionDeny}},
	} {
		t.Run(p.name, func(t *testing.T) {
			s.register(t, p.policy)
			s.ns.IP(t, "neigh", "flush", "dev", bridge)
			s.write(t, eth(bcastMAC, vmMAC, nil, etARP, arp(1, vmMAC, vm4, gw4)))
			if !s.readReply(func(f []byte) bool {
				return len(f) >= 42 && binary.BigEndian.Uint16(f[12:14]) == etARP &&
					binary.BigEndian.Uint16(f[20:22]) == 2 && bytes.Equal(f[28:32], netipBytes(gw4))
			}) {
				t.Errorf("policy %+v: no ARP reply for %s", p.policy, gw4)
			}
			sn := solicitedNode(gw6)
			s.write(t, eth(multicastMAC(sn), vmMAC, nil, etIPv6,
				ipv6(vm6, sn, nil, protoICMPv6, icmp6(vm6, sn, 135, 0, neighborSolicit(gw6, vmMAC, false)), 255)))
			if !s.readReply(func(f []byte) bool {
				return len(f) >= 78 && binary.BigEndian.Uint16(f[12:14]) == etIPv6 && f[20] == protoICMPv6 &&
					f[54] == 136 && bytes.Equal(f[62:78], netipBytes(gw6))
			}) {
				t.Errorf("policy %+v: no neighbor advertisement for %s", p.policy, gw6)
			}
		})
	}
}
