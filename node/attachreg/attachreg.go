// Package attachreg is the one place that registers and unregisters an
// interface's eBPF rows and attaches the datapath program to it. CNI ADD and
// DEL and the stale tap reclaim all go through it, so they write and clear
// exactly the same rows.
//
// It is also the only place that knows which maps hold rows of one
// interface: adding such a map to the datapath means adding it to
// perInterfaceMaps here, and the tests fail until that is done.
package attachreg

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	ciliumlink "github.com/cilium/ebpf/link"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/netns"
)

// ErrInvalidRegistration is wrapped by errors for input that cannot be
// registered; nothing is written when it is returned.
var ErrInvalidRegistration = errors.New("invalid registration")

// linkPinSubdir holds one pinned TCX link per registered interface, so that
// the attachment outlives the short-lived CNI process that made it.
const linkPinSubdir = "links"

// Registration is everything the datapath holds about one interface.
type Registration struct {
	Identity      identity.Identity
	Table         uint32 // the VRF's routing table
	Egress        datapath.EgressKind
	Policy        datapath.Policy
	Gateway       datapath.Gateway
	HostOnlyPorts []ProtoPort
	// MAC and Addresses are the attachment's own, which anti-spoofing binds
	// its frames to: the VM's MAC (nil: not known, so not checked) and the
	// prefixes its addresses are in (up to datapath.MaxPrefixes per
	// family). With anti-spoofing on, a family with no prefix has no
	// address the attachment may send from.
	MAC       net.HardwareAddr
	Addresses []netip.Prefix
}

// ProtoPort is a port of the tenant gateway an interface's tenant may reach,
// as a configuration writes it ("udp/53"): a protocol and a port, for no
// interface yet. Registered for an interface, it is a row of the
// host_only_port map, keyed by a datapath.HostPort (On).
type ProtoPort struct {
	Protocol datapath.Protocol
	Port     uint16
}

// On returns p's host_only_port key for the interface ifindex.
func (p ProtoPort) On(ifindex uint32) datapath.HostPort {
	return datapath.HostPort{Ifindex: ifindex, Protocol: p.Protocol, Port: p.Port}
}

// ParseProtoPort parses "tcp/PORT" or "udp/PORT", as configurations write
// host-only ports.
func ParseProtoPort(s string) (ProtoPort, error) {
	proto, port, ok := strings.Cut(s, "/")
	n, err := strconv.ParseUint(port, 10, 16)
	if !ok || err != nil || n == 0 {
		return ProtoPort{}, fmt.Errorf("host-only port %q: want tcp/PORT or udp/PORT", s)
	}
	switch proto {
	case "tcp":
		return ProtoPort{Protocol: datapath.ProtocolTCP, Port: uint16(n)}, nil
	case "udp":
		return ProtoPort{Protocol: datapath.ProtocolUDP, Port: uint16(n)}, nil
	}
	return ProtoPort{}, fmt.Errorf("host-only port %q: want tcp/PORT or udp/PORT", s)
}

// Registry registers interfaces of one network namespace.
type Registry struct {
	dp  *datapath.Datapath
	ns  *os.File // nil: the caller's namespace
	log *slog.Logger
	// Bindings says what an older build's ADD registered an interface
	// with, so that taking it over binds it; nil: nothing says it.
	Bindings BindingSource
}

// BindingSource rebuilds the registration an older build's ADD made for
// the interface ifindex of identity id, from a record of that ADD (the
// runtime's). An error says why it cannot: the interface is then left
// unbound, and counted so.
type BindingSource interface {
	Registration(ifindex uint32, id identity.Identity) (Registration, error)
}

// New returns a Registry over dp for interfaces in namespace ns (nil for the
// caller's).
func New(dp *datapath.Datapath, ns *os.File, log *slog.Logger) *Registry {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registry{dp: dp, ns: ns, log: log}
}

// perInterfaceMap is one map holding rows of an interface, and how to read
// and clear them.
type perInterfaceMap struct {
	name   string
	rows   func(ifindex uint32) (any, bool, error) // the rows, whether any exist
	delete func(ifindex uint32) error              // idempotent
	count  func() (map[uint32]int, error)          // rows by ifindex, one batch dump
}

func (r *Registry) perInterfaceMaps() []perInterfaceMap {
	d := r.dp
	// A zeroed row first: the program may still read the element (RemoveRules).
	rules := keyed(d.TapRules)
	rules.delete = func(ifindex uint32) error {
		if err := d.RemoveRules(ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
		return nil
	}
	return []perInterfaceMap{
		keyed(d.IfindexVRF),
		rules,
		keyed(d.TapFragments),
		keyed(d.TrafficPolicy),
		keyed(d.EgressKind),
		keyed(d.TenantGateway),
		{
			name: d.HostOnlyPort.Name(),
			count: func() (map[uint32]int, error) {
				rows, err := d.HostOnlyPort.Dump(0)
				out := make(map[uint32]int, len(rows))
				for _, row := range rows {
					out[row.Key.Ifindex]++
				}
				return out, err
			},
			rows: func(ifindex uint32) (any, bool, error) {
				ports, err := r.hostPorts(ifindex)
				return ports, len(ports) > 0, err
			},
			delete: func(ifindex uint32) error {
				ports, err := r.hostPorts(ifindex)
				if err != nil {
					return err
				}
				var errs []error
				for _, p := range ports {
					if err := d.HostOnlyPort.Delete(p); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
						errs = append(errs, err)
					}
				}
				return errors.Join(errs...)
			},
		},
	}
}

// ifindexKeyed is a map whose key is the ifindex itself: a datapath.Table,
// or the table of tables datapath.FragmentTables.
type ifindexKeyed[V any] interface {
	Name() string
	Get(ifindex uint32) (V, error)
	Delete(ifindex uint32) error
	Dump(limit int) ([]datapath.Row[uint32, V], error)
}

// keyed describes a map whose key is the ifindex itself.
func keyed[V any](t ifindexKeyed[V]) perInterfaceMap {
	return perInterfaceMap{
		name: t.Name(),
		rows: func(ifindex uint32) (any, bool, error) {
			v, err := t.Get(ifindex)
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return nil, false, nil
			}
			return v, err == nil, err
		},
		delete: func(ifindex uint32) error {
			if err := t.Delete(ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
			return nil
		},
		count: func() (map[uint32]int, error) {
			rows, err := t.Dump(0)
			out := make(map[uint32]int, len(rows))
			for _, row := range rows {
				out[row.Key]++
			}
			return out, err
		},
	}
}

// hostPorts returns the host_only_port keys of ifindex. The map is keyed by
// (ifindex, protocol, port), so finding one interface's rows is a walk.
func (r *Registry) hostPorts(ifindex uint32) ([]datapath.HostPort, error) {
	rows, err := r.dp.HostOnlyPort.Dump(0)
	if err != nil {
		return nil, err
	}
	var ports []datapath.HostPort
	for _, row := range rows {
		if row.Key.Ifindex == ifindex {
			ports = append(ports, row.Key)
		}
	}
	return ports, nil
}

func (reg Registration) validate(ifindex uint32) error {
	if ifindex == 0 {
		return fmt.Errorf("%w: ifindex 0", ErrInvalidRegistration)
	}
	return reg.Validate()
}

// Validate refuses a registration that cannot be registered for any
// interface, naming every fault; it wraps ErrInvalidRegistration.
func (reg Registration) Validate() error {
	var errs []error
	if !reg.Identity.Valid() {
		errs = append(errs, fmt.Errorf("identity %v is not valid", reg.Identity))
	}
	if reg.Table == 0 {
		errs = append(errs, errors.New("table 0"))
	}
	if reg.Egress != datapath.EgressTap && reg.Egress != datapath.EgressVeth {
		errs = append(errs, fmt.Errorf("egress kind %d", uint32(reg.Egress)))
	}
	if reg.Policy.DefaultAction > datapath.ActionDeny ||
		len(reg.Policy.Ethertypes) > datapath.MaxEthertypes || len(reg.Policy.Protocols) > datapath.MaxProtocols {
		errs = append(errs, fmt.Errorf("policy %+v exceeds the datapath's limits", reg.Policy))
	}
	if (reg.Gateway.IPv4.IsValid() && !reg.Gateway.IPv4.Is4()) || (reg.Gateway.IPv6.IsValid() && (!reg.Gateway.IPv6.Is6() || reg.Gateway.IPv6.Is4In6())) {
		errs = append(errs, fmt.Errorf("gateway %+v: wrong address families", reg.Gateway))
	}
	if len(reg.MAC) != 0 && (len(reg.MAC) != 6 || reg.MAC[0]&1 != 0 || bytes.Equal(reg.MAC, make([]byte, 6))) {
		errs = append(errs, fmt.Errorf("mac %v: want a unicast Ethernet address", reg.MAC))
	}
	var v4, v6 int
	for _, p := range reg.Addresses {
		switch {
		case !p.IsValid() || p.Addr().Is4In6():
			errs = append(errs, fmt.Errorf("address prefix %v is not valid", p))
		case p.Addr().Is4():
			v4++
		default:
			v6++
		}
	}
	if v4 > datapath.MaxPrefixes || v6 > datapath.MaxPrefixes {
		errs = append(errs, fmt.Errorf("%d IPv4 and %d IPv6 address prefixes, at most %d of each", v4, v6, datapath.MaxPrefixes))
	}
	if len(reg.HostOnlyPorts) > datapath.MaxHostPorts {
		errs = append(errs, fmt.Errorf("%d host-only ports, at most %d", len(reg.HostOnlyPorts), datapath.MaxHostPorts))
	}
	for _, p := range reg.HostOnlyPorts {
		if (p.Protocol != datapath.ProtocolTCP && p.Protocol != datapath.ProtocolUDP) || p.Port == 0 {
			errs = append(errs, fmt.Errorf("host-only port %v/%d: want tcp or udp and a port", p.Protocol, p.Port))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRegistration, err)
	}
	return nil
}

// RegisterInterface writes every row of the interface ifindex and attaches
// the datapath program to its TCX ingress. Registering again replaces the
// rows (host-only ports not listed any more are removed) and keeps the
// attachment. Invalid input is refused before anything is written; a failure
// part-way removes what was written, so no interface is left half-registered.
//
// Registering again is make-before-break: the program judges frames by the
// tap_rules row alone, which is replaced whole and in place, so every frame
// is judged by the old registration or the new one, never a mix. The link
// moves to this build's program only once that row is written, and the rows
// that older builds' programs read are written after it.
func (r *Registry) RegisterInterface(ctx context.Context, ifindex uint32, reg Registration) error {
	if err := reg.validate(ifindex); err != nil {
		return fmt.Errorf("register interface %d: %w", ifindex, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("register interface %d: %w", ifindex, err)
	}
	fail := func(err error) error {
		return fmt.Errorf("register interface %d: %w", ifindex, errors.Join(err, r.UnregisterInterface(ctx, ifindex)))
	}
	if err := r.writeRules(ifindex, reg); err != nil {
		return fail(err)
	}
	if err := r.attach(ifindex); err != nil {
		return fail(err)
	}
	if err := r.writeOlderBuildsRows(ifindex, reg); err != nil {
		return fail(err)
	}
	if !reg.Policy.AllowSpoofing && len(reg.Addresses) == 0 {
		r.log.Warn("anti-spoofing is on and the registration names no address of the attachment: "+
			"every IP packet it sends from an address is dropped as spoofed (give its routes or addresses, or allowSpoofing)",
			"ifindex", ifindex, "identity", reg.Identity.String())
	}
	r.log.Info("interface registered", "ifindex", ifindex, "identity", reg.Identity.String(),
		"table", reg.Table, "egress", reg.Egress.String(), "host_only_ports", len(reg.HostOnlyPorts),
		"mac", reg.MAC.String(), "addresses", len(reg.Addresses), "anti_spoofing", !reg.Policy.AllowSpoofing)
	return nil
}

// writeRules writes the rows this build's program reads: the identity row
// first (what an interrupted registration is found by), the fragment table,
// and last the rules, which make the interface registered.
func (r *Registry) writeRules(ifindex uint32, reg Registration) error {
	d := r.dp
	err := errors.Join(
		d.IfindexVRF.Put(ifindex, VRFBinding(reg.Identity, reg.Table)),
		d.EgressKind.Put(ifindex, reg.Egress),
		d.TapFragments.Ensure(ifindex),
	)
	if err != nil {
		return err
	}
	return d.TapRules.Put(ifindex, reg.Rules(ifindex))
}

// Rules is the tap_rules row reg registers for the interface ifindex.
func (reg Registration) Rules(ifindex uint32) datapath.Rules {
	var ports []datapath.Port
	for _, p := range reg.HostOnlyPorts {
		ports = append(ports, datapath.Port{Protocol: p.Protocol, Port: p.Port})
	}
	var prefixes []netip.Prefix
	for _, p := range reg.Addresses {
		prefixes = append(prefixes, p.Masked())
	}
	b := VRFBinding(reg.Identity, reg.Table)
	return datapath.Rules{Ifindex: ifindex, VPC: b.VPC, Attachment: b.Attachment,
		Policy: reg.Policy, Gateway: reg.Gateway, HostPorts: ports,
		MAC: datapath.HardwareAddr(reg.MAC), Prefixes: prefixes}
}

// writeOlderBuildsRows writes the registration as the programs of older
// builds read it, split over traffic_policy, tenant_gateway and
// host_only_port: taps those builds attached keep their program until they
// are registered again, which moves them to this build's.
func (r *Registry) writeOlderBuildsRows(ifindex uint32, reg Registration) error {
	d := r.dp
	stale, err := r.hostPorts(ifindex)
	if err != nil {
		return err
	}
	if err := d.TenantGateway.Put(ifindex, reg.Gateway); err != nil {
		return err
	}
	keep := make(map[datapath.HostPort]bool, len(reg.HostOnlyPorts))
	for _, p := range reg.HostOnlyPorts {
		k := p.On(ifindex)
		keep[k] = true
		if err := d.HostOnlyPort.Put(k, true); err != nil {
			return err
		}
	}
	for _, k := range stale {
		if !keep[k] {
			if err := d.HostOnlyPort.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
		}
	}
	// The policy goes last: the program treats an interface without one as
	// unregistered, so it never applies a policy whose other rows are missing.
	return d.TrafficPolicy.Put(ifindex, reg.Policy)
}

func (r *Registry) linkPin(ifindex uint32) string {
	return filepath.Join(r.dp.PinDir(), linkPinSubdir, linkPinPrefix+strconv.FormatUint(uint64(ifindex), 10))
}

const linkPinPrefix = "tcx_ingress_"

// linkPins lists the TCX link pins this package made, by ifindex.
func (r *Registry) linkPins() (map[uint32]string, error) {
	dir := filepath.Join(r.dp.PinDir(), linkPinSubdir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tcx links: %w", err)
	}
	out := make(map[uint32]string, len(entries))
	for _, e := range entries {
		digits, ok := strings.CutPrefix(e.Name(), linkPinPrefix)
		n, err := strconv.ParseUint(digits, 10, 32)
		if !ok || err != nil || n == 0 {
			continue // not a pin this package made
		}
		out[uint32(n)] = filepath.Join(dir, e.Name())
	}
	return out, nil
}

// attach attaches the program to ifindex's TCX ingress and pins the link,
// or, when a pinned link exists, points it at this build's program.
func (r *Registry) attach(ifindex uint32) error {
	// A pin left by a deleted device whose ifindex came back cannot be
	// updated: it goes, and a new link is attached.
	if err := r.detachWhenGone(ifindex); err != nil {
		return err
	}
	pin := r.linkPin(ifindex)
	if l, err := ciliumlink.LoadPinnedLink(pin, nil); err == nil {
		defer l.Close()
		if err := l.Update(r.dp.Program()); err != nil {
			return fmt.Errorf("update tcx link %s: %w", pin, err)
		}
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("load tcx link %s: %w", pin, err)
	}
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		return fmt.Errorf("tcx link folder: %w", err)
	}
	var l ciliumlink.Link
	err := netns.Do(r.ns, func() error {
		// The kernel resolves the ifindex in the calling thread's namespace.
		var err error
		l, err = ciliumlink.AttachTCX(ciliumlink.TCXOptions{Interface: int(ifindex), Program: r.dp.Program(), Attach: ebpf.AttachTCXIngress})
		return err
	})
	if err != nil {
		return fmt.Errorf("attach tcx ingress: %w", err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		return fmt.Errorf("pin tcx link %s: %w", pin, err)
	}
	return nil
}

// UnregisterInterface removes every row keyed by ifindex in every
// per-interface map, and detaches the program once the interface is gone:
// until then the program drops all its frames. A missing row or attachment
// is fine, so it can be repeated. It never stops at the first failure: every
// map is tried, and the failures are returned joined, each naming its map.
func (r *Registry) UnregisterInterface(ctx context.Context, ifindex uint32) error {
	if ifindex == 0 {
		return fmt.Errorf("unregister interface 0: %w", ErrInvalidRegistration)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("unregister interface %d: %w", ifindex, err)
	}
	return r.unregister(ifindex, r.perInterfaceMaps())
}

// unregister is UnregisterInterface over maps. A test passes maps whose
// delete fails (export_test.go): a real map delete cannot be made to fail on
// demand, and the product carries no switch for it.
func (r *Registry) unregister(ifindex uint32, maps []perInterfaceMap) error {
	var errs []error
	for _, s := range r.unregisterSteps(ifindex, maps) {
		if err := s.do(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.what, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("unregister interface %d: %w", ifindex, err)
	}
	r.log.Info("interface unregistered", "ifindex", ifindex)
	return nil
}

// unregisterStep is one step of an unregister; what names it in errors.
type unregisterStep struct {
	what string
	do   func() error
}

// unregisterSteps are an unregister's steps in the order they run, which is
// what a teardown killed between any two of them leaves behind. The policy
// row goes first: from then on the program drops the interface's frames as
// unregistered instead of applying a half-removed configuration. The
// ifindex_vrf row goes last, after the link pin: whatever is left still
// names its identity (Registered), so the DEL the runtime retries for that
// identity finds it even though the tap is already gone.
func (r *Registry) unregisterSteps(ifindex uint32, maps []perInterfaceMap) []unregisterStep {
	var steps []unregisterStep
	var identityRow *unregisterStep
	for _, m := range orderPolicyFirst(maps) {
		s := unregisterStep{what: "map " + m.name, do: func() error { return m.delete(ifindex) }}
		if m.name == r.dp.IfindexVRF.Name() {
			identityRow = &s
			continue
		}
		steps = append(steps, s)
	}
	// The identity whose counters may go too, read before its row goes.
	id, bound, idErr := r.boundIdentity(ifindex)
	steps = append(steps,
		unregisterStep{what: "map decisions", do: func() error {
			if idErr != nil {
				return fmt.Errorf("identity: %w", idErr)
			}
			return r.clearDecisionsOf(ifindex, id, bound)
		}},
		unregisterStep{what: "tcx link", do: func() error { return r.detachWhenGone(ifindex) }},
	)
	if identityRow != nil {
		steps = append(steps, *identityRow)
	}
	return steps
}

// orderPolicyFirst puts the rows that make an interface registered first:
// this build's rules, then the policy older builds' programs read.
func orderPolicyFirst(maps []perInterfaceMap) []perInterfaceMap {
	rank := func(m perInterfaceMap) int {
		switch m.name {
		case "tap_rules":
			return 0
		case "traffic_policy":
			return 1
		}
		return 2
	}
	out := slices.Clone(maps)
	slices.SortStableFunc(out, func(a, b perInterfaceMap) int { return cmp.Compare(rank(a), rank(b)) })
	return out
}

// InterfaceRows is every row of one interface, by map name, and whether the
// program is attached.
type InterfaceRows struct {
	Ifindex  uint32         `json:"ifindex"`
	Rows     map[string]any `json:"rows"`
	Attached bool           `json:"attached"`
	// Program is what the attached link runs; nil when none is attached.
	Program *Program `json:"program,omitempty"`
}

// Rows returns every row keyed by ifindex across the per-interface maps.
func (r *Registry) Rows(ifindex uint32) (InterfaceRows, error) {
	if ifindex == 0 {
		return InterfaceRows{}, fmt.Errorf("rows of interface 0: %w", ErrInvalidRegistration)
	}
	out := InterfaceRows{Ifindex: ifindex, Rows: map[string]any{}}
	var errs []error
	for _, m := range r.perInterfaceMaps() {
		v, ok, err := m.rows(ifindex)
		if err != nil {
			errs = append(errs, fmt.Errorf("map %s: %w", m.name, err))
			continue
		}
		if ok {
			out.Rows[m.name] = v
		}
	}
	if _, err := os.Stat(r.linkPin(ifindex)); err == nil {
		out.Attached = true
		p, live, err := r.programOf(ifindex)
		if err != nil {
			errs = append(errs, err)
		} else if live {
			out.Program = &p
		}
	}
	return out, errors.Join(errs...)
}

// Dump returns up to limit rows of the map called name (limit <= 0: all);
// an unknown name is datapath.ErrUnknownMap.
func (r *Registry) Dump(name string, limit int) ([]datapath.Row[any, any], error) {
	t, err := r.dp.Table(name)
	if err != nil {
		return nil, err
	}
	return t.DumpAny(limit)
}

// PerInterfaceMaps names the maps that hold rows of one interface.
func (r *Registry) PerInterfaceMaps() []string {
	var names []string
	for _, m := range r.perInterfaceMaps() {
		names = append(names, m.name)
	}
	return names
}

// Registered is one interface the pinned maps or link pins hold anything of.
type Registered struct {
	Ifindex uint32 `json:"ifindex"`
	// Identity is what its ifindex_vrf row names; the zero identity when
	// that row is missing.
	Identity identity.Identity `json:"identity"`
	Rows     map[string]int    `json:"rows"` // rows by map
	Pinned   bool              `json:"pinned"`
}

// Registered lists every interface that any per-interface map holds a row
// of or whose TCX link is pinned, with one batch dump per map: the input of
// the orphan collection, which compares it with the links that exist.
func (r *Registry) Registered() ([]Registered, error) {
	byIndex := make(map[uint32]*Registered, 1024)
	get := func(ifindex uint32) *Registered {
		reg, ok := byIndex[ifindex]
		if !ok {
			reg = &Registered{Ifindex: ifindex, Rows: map[string]int{}}
			byIndex[ifindex] = reg
		}
		return reg
	}
	// ifindex_vrf is read whole, for the identity each row names.
	vrfMap := r.dp.IfindexVRF.Name()
	bindings, err := r.dp.IfindexVRF.Dump(0)
	if err != nil {
		return nil, fmt.Errorf("list registered interfaces: map %s: %w", vrfMap, err)
	}
	for _, b := range bindings {
		reg := get(b.Key)
		reg.Identity = IdentityOf(b.Value.VPC, b.Value.Attachment)
		reg.Rows[vrfMap] = 1
	}
	for _, m := range r.perInterfaceMaps() {
		if m.name == vrfMap {
			continue
		}
		counts, err := m.count()
		if err != nil {
			return nil, fmt.Errorf("list registered interfaces: map %s: %w", m.name, err)
		}
		for ifindex, n := range counts {
			get(ifindex).Rows[m.name] = n
		}
	}
	pins, err := r.linkPins()
	if err != nil {
		return nil, fmt.Errorf("list registered interfaces: %w", err)
	}
	for ifindex := range pins {
		get(ifindex).Pinned = true
	}
	out := make([]Registered, 0, len(byIndex))
	for _, reg := range byIndex {
		out = append(out, *reg)
	}
	slices.SortFunc(out, func(a, b Registered) int { return cmp.Compare(a.Ifindex, b.Ifindex) })
	return out, nil
}
