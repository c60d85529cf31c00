package cnitap

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/link"
)

// Check verifies everything ADD set up, and names the first difference: the
// tap and its state (stamp, up, master, MTU), its MAC against prevResult,
// every route in its table, every eBPF row against the configuration, and
// the TCX attachment.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	return p.run(args, cmdCheck, p.check)
}

func (p *Plugin) check(inv *invocation, e *env) error {
	ctx := context.Background()
	fail := func(format string, a ...any) error {
		return types.NewError(ErrCheckFailed, fmt.Sprintf(format, a...), "")
	}
	name := inv.identity.TapName()
	l, err := e.conn.GetByName(ctx, name)
	if errors.Is(err, link.ErrLinkGone) {
		return fail("tap %s does not exist", name)
	}
	if err != nil {
		return err
	}
	if _, ok := l.AsTap(); !ok {
		return fail("%s is not a tenant tap (kind %q)", name, l.Kind)
	}
	if l.Alias != inv.containerID {
		return fail("tap %s is stamped %q, not by container %s", name, l.Alias, inv.containerID)
	}
	if !l.AdminUp {
		return fail("tap %s is down", name)
	}
	master, err := e.conn.Get(ctx, l.Master)
	if l.Master == 0 || err != nil || master.Name != inv.identity.VRFName() {
		return fail("tap %s is not enslaved to its VRF %s", name, inv.identity.VRFName())
	}
	if want := inv.tap.MTU; want != 0 && l.MTU != want {
		return fail("tap %s has MTU %d, configured %d", name, l.MTU, want)
	}
	if mac, ok, err := prevMAC(inv.conf, name); err != nil {
		return err
	} else if ok && mac != l.Address.String() {
		return fail("tap %s has MAC %s, prevResult says %s", name, l.Address, mac)
	}
	routes, err := e.conn.RoutesVia(ctx, l.Index, inv.tap.Table)
	if err != nil {
		return err
	}
	for _, want := range inv.tap.Routes {
		if !slices.Contains(routes, want.Masked()) {
			return fail("tap %s lacks its route %s in table %d", name, want, inv.tap.Table)
		}
	}
	return checkRows(e, l.Index, inv, fail)
}

// checkRows compares every eBPF row of ifindex, and its TCX attachment, with
// what the configuration registers.
func checkRows(e *env, ifindex uint32, inv *invocation, fail func(string, ...any) error) error {
	name, reg, d := inv.identity.TapName(), inv.reg, e.dp
	binding, err := d.IfindexVRF.Get(ifindex)
	if err != nil {
		return fail("tap %s (ifindex %d) lacks its ifindex_vrf row: %v", name, ifindex, err)
	}
	if want := attachreg.VRFBinding(reg.Identity, reg.Table); binding != want {
		return fail("tap %s ifindex_vrf row is %+v, configured %+v", name, binding, want)
	}
	rules, err := d.TapRules.Get(ifindex)
	if err != nil {
		return fail("tap %s lacks its tap_rules row: %v", name, err)
	}
	if want := reg.Rules(ifindex); !sameRules(rules, want) {
		return fail("tap %s tap_rules row is %+v, configured %+v", name, rules, want)
	}
	policy, err := d.TrafficPolicy.Get(ifindex)
	if err != nil {
		return fail("tap %s lacks its traffic_policy row: %v", name, err)
	}
	if !samePolicy(policy, reg.Policy) {
		return fail("tap %s traffic_policy row is %+v, configured %+v", name, policy, reg.Policy)
	}
	egress, err := d.EgressKind.Get(ifindex)
	if err != nil || egress != reg.Egress {
		return fail("tap %s egress_kind row is %v (%v), configured %v", name, egress, err, reg.Egress)
	}
	gw, err := d.TenantGateway.Get(ifindex)
	if err != nil || gw != reg.Gateway {
		return fail("tap %s tenant_gateway row is %+v (%v), configured %+v", name, gw, err, reg.Gateway)
	}
	rows, err := e.reg.Rows(ifindex)
	if err != nil {
		return err
	}
	var have []datapath.HostPort
	if hp, ok := rows.Rows[d.HostOnlyPort.Name()].([]datapath.HostPort); ok {
		have = hp
	}
	want := make([]datapath.HostPort, 0, len(reg.HostOnlyPorts))
	for _, p := range reg.HostOnlyPorts {
		want = append(want, p.On(ifindex))
	}
	if !sameSet(have, want) {
		return fail("tap %s host_only_port rows are %v, configured %v", name, have, want)
	}
	if !rows.Attached {
		return fail("tap %s (ifindex %d) has no TCX program attached", name, ifindex)
	}
	return nil
}

func samePolicy(a, b datapath.Policy) bool {
	return reflect.DeepEqual(normPolicy(a), normPolicy(b))
}

// normPolicy makes empty lists nil, as a row read back has them.
func normPolicy(p datapath.Policy) datapath.Policy {
	if len(p.Ethertypes) == 0 {
		p.Ethertypes = nil
	}
	if len(p.Protocols) == 0 {
		p.Protocols = nil
	}
	return p
}

// sameRules compares rules as the program reads them: lists in order
// (prefixes by family, as the row holds them), empty and nil alike.
func sameRules(a, b datapath.Rules) bool {
	norm := func(r datapath.Rules) datapath.Rules {
		r.Policy = normPolicy(r.Policy)
		if len(r.HostPorts) == 0 {
			r.HostPorts = nil
		}
		if len(r.MAC) == 0 {
			r.MAC = nil
		}
		var v4, v6 []netip.Prefix
		for _, p := range r.Prefixes {
			if p.Addr().Is4() {
				v4 = append(v4, p.Masked())
			} else {
				v6 = append(v6, p.Masked())
			}
		}
		r.Prefixes = slices.Concat(v4, v6)
		return r
	}
	return reflect.DeepEqual(norm(a), norm(b))
}

func sameSet[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

// prevMAC returns the MAC prevResult gives the tap, if it names the tap.
func prevMAC(conf NetConf, name string) (string, bool, error) {
	res, err := prevResult(conf)
	if err != nil || res == nil {
		return "", false, err
	}
	for _, i := range res.Interfaces {
		if i.Name == name && i.Sandbox == "" {
			return i.Mac, true, nil
		}
	}
	return "", false, nil
}

// prevResult is the result of the plugins before this one in the chain,
// in this version's form, or nil at the head of a chain.
func prevResult(conf NetConf) (*current.Result, error) {
	if conf.RawPrevResult == nil {
		return nil, nil
	}
	pc := conf.PluginConf
	if err := version.ParsePrevResult(&pc); err != nil {
		return nil, fmt.Errorf("%w: prevResult: %w", errConfig, err)
	}
	res, err := current.NewResultFromResult(pc.PrevResult)
	if err != nil {
		return nil, fmt.Errorf("%w: prevResult: %w", errConfig, err)
	}
	return res, nil
}

// Status only checks, and changes nothing: the lock folder must exist and
// be writable, and the node daemon's maps must be pinned at the configured
// bpffs. Until then it answers 50, plugin not available, so that the
// runtime sends no ADD that would write rows nothing reads.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	inv, err := parse(args, cmdStatus)
	if err != nil {
		return cniError(err)
	}
	unavailable := func(err error) error {
		return types.NewError(types.ErrPluginNotAvailable, "galactic-tap not available", err.Error())
	}
	if fi, err := os.Stat(inv.conf.VRFLockDir); err != nil {
		return unavailable(fmt.Errorf("lock folder %s: %w", inv.conf.VRFLockDir, err))
	} else if !fi.IsDir() {
		return unavailable(fmt.Errorf("lock folder %s is not a folder", inv.conf.VRFLockDir))
	}
	if err := accessWritable(inv.conf.VRFLockDir); err != nil {
		return unavailable(fmt.Errorf("lock folder %s not writable: %w", inv.conf.VRFLockDir, err))
	}
	dp, err := datapath.OpenPinned(inv.conf.BPFFS)
	if err != nil {
		return unavailable(err)
	}
	return dp.Close()
}
