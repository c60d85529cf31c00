// Package datapath loads the TCX ingress program of tenant taps and the
// maps it reads, pinned under <bpffs>/galactic so that a daemon restart loses
// no rows, and gives each map a typed API whose rows marshal to readable
// JSON (addresses as strings, actions and decisions as words, identities in
// base62).
//
// It knows layouts, not meaning: which maps hold rows of one interface is
// node/attachreg's business. The C source is bpf/datapath.c; the generated
// bindings and object are committed, so building needs no clang (make
// generate rebuilds them). TCX needs Linux 6.6 or later; batch look-ups fall
// back to iteration where the kernel lacks them.
package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
)

// PinSubdir is the folder under the bpffs mount where maps are pinned.
const PinSubdir = "galactic"

// Datapath is the loaded program and its maps.
type Datapath struct {
	pinDir string
	objs   datapathObjects
	// routeEpoch is the pinned route_epoch the program instances share;
	// nil when only the maps of rows were opened (OpenPinned).
	routeEpoch *ebpf.Map
	// hostFilter is the host filter as PublishHostView last wrote it; nil:
	// unknown, so the next write covers every block. hostFilterPartial: it
	// does not cover every host prefix.
	hostFilter        []datapathHostBlock
	hostFilterPartial bool
	// migrated names the pinned maps Load gave this build's capacity.
	migrated []string

	IfindexVRF *Table[uint32, VRFBinding]
	// TapRules is what the program judges frames by. Remove its rows with
	// RemoveRules, not Delete.
	TapRules      *Table[uint32, Rules]
	TapFragments  *FragmentTables
	TrafficPolicy *Table[uint32, Policy]
	EgressKind    *Table[uint32, EgressKind]
	TenantGateway *Table[uint32, Gateway]
	HostOnlyPort  *Table[HostPort, bool]
	Decisions     *Table[DecisionKey, uint64]
	Unattributed  *Table[Reason, uint64]
}

// Load mounts bpffs at bpffs if nothing is mounted there (creating the
// folder), loads the program, and creates its maps or reuses those already
// pinned under <bpffs>/galactic. A pinned map whose capacity alone differs
// from this build's is migrated: a map of this build's capacity with the
// same rows takes its pin (Migrated). One whose layout differs otherwise is
// an error, never silently replaced: it holds live rows. The
// program's state maps, pinned under <bpffs>/galactic/state and shared by
// every loaded instance, hold no rows and are replaced instead (state.go).
func Load(bpffs string) (*Datapath, error) {
	if err := EnsureBPFFS(bpffs); err != nil {
		return nil, err
	}
	pinDir := filepath.Join(bpffs, PinSubdir)
	if err := os.MkdirAll(pinDir, 0o700); err != nil {
		return nil, fmt.Errorf("load datapath: pin folder: %w", err)
	}
	spec, err := loadDatapath()
	if err != nil {
		return nil, fmt.Errorf("load datapath: spec: %w", err)
	}
	state, err := stateMaps(spec, filepath.Join(pinDir, StateSubdir))
	if err != nil {
		return nil, fmt.Errorf("load datapath: %w", err)
	}
	// The collection uses clones of the state maps; these handles go.
	defer func() {
		for _, m := range state {
			m.Close()
		}
	}()
	migrated, err := migrateCapacities(spec, pinDir)
	if err != nil {
		return nil, fmt.Errorf("load datapath: %w", err)
	}
	d := &Datapath{pinDir: pinDir, migrated: migrated}
	if err := spec.LoadAndAssign(&d.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}, MapReplacements: state}); err != nil {
		return nil, fmt.Errorf("load datapath from %s: %w", pinDir, incompatible(err))
	}
	d.assignTables(spec.Maps[datapathMapTapFragments].InnerMap)
	d.routeEpoch = d.objs.RouteEpoch
	return d, nil
}

// assignTables gives each loaded map its typed Table; fragments is the
// layout of tap_fragments' inner maps.
func (d *Datapath) assignTables(fragments *ebpf.MapSpec) {
	m := &d.objs.datapathMaps
	u32 := func(k uint32) (uint32, error) {
		if k == 0 {
			return 0, fmt.Errorf("ifindex 0: %w", ErrInvalidRow)
		}
		return k, nil
	}
	id := func(k uint32) uint32 { return k }
	ok := func(v uint64) (uint64, error) { return v, nil }
	u64 := func(v uint64) uint64 { return v }
	d.IfindexVRF = newTable("ifindex_vrf", m.IfindexVrf, u32, id, VRFBinding.raw, vrfBindingFrom)
	d.TapRules = newLockedTable("tap_rules", m.TapRules, u32, id, Rules.raw, rulesFrom)
	d.TapFragments = &FragmentTables{m: m.TapFragments, inner: fragments}
	d.TrafficPolicy = newTable("traffic_policy", m.TrafficPolicy, u32, id, Policy.raw, policyFrom)
	d.EgressKind = newTable("egress_kind", m.EgressKind, u32, id, EgressKind.raw, func(v uint32) EgressKind { return EgressKind(v) })
	d.TenantGateway = newTable("tenant_gateway", m.TenantGateway, u32, id, Gateway.raw, gatewayFrom)
	d.HostOnlyPort = newTable("host_only_port", m.HostOnlyPort, HostPort.raw, hostPortFrom,
		func(b bool) (uint8, error) {
			if b {
				return 1, nil
			}
			return 0, nil
		}, func(v uint8) bool { return v != 0 })
	d.Decisions = newTable("decisions", m.Decisions, DecisionKey.raw, decisionKeyFrom, ok, u64)
	d.Unattributed = newTable("unattributed", m.Unattributed,
		func(r Reason) (uint32, error) { return uint32(r), nil }, func(k uint32) Reason { return Reason(k) }, ok, u64)
}

// ErrNoProgramState: the datapath was opened without its program
// (OpenPinned), so it holds no handle on the program's shared state.
var ErrNoProgramState = errors.New("datapath opened without its program state")

// BumpRouteEpoch makes every route answer the program instances cached so
// far stale: the next frame to each destination asks the kernel again. The
// node daemon calls it for every address and route change it reads. It
// returns the new epoch. One writer at a time: the daemon.
func (d *Datapath) BumpRouteEpoch() (uint64, error) {
	if d.routeEpoch == nil {
		return 0, fmt.Errorf("bump route epoch: %w", ErrNoProgramState)
	}
	var epoch uint64
	if err := d.routeEpoch.Lookup(uint32(0), &epoch); err != nil {
		return 0, fmt.Errorf("bump route epoch: %w", err)
	}
	epoch++
	if err := d.routeEpoch.Put(uint32(0), epoch); err != nil {
		return 0, fmt.Errorf("bump route epoch: %w", err)
	}
	return epoch, nil
}

// RemoveRules removes ifindex's tap_rules row. It first zeroes the row in
// place, under its lock: the program may still hold the element, which the
// kernel hands to the next row inserted, and a zeroed row names no
// interface, so a reader of the recycled element drops its frame rather
// than judge it by another interface's rules. A missing row is
// ebpf.ErrKeyNotExist.
func (d *Datapath) RemoveRules(ifindex uint32) error {
	m := d.objs.TapRules
	var zero datapathTapRules
	if err := m.Update(ifindex, &zero, ebpf.UpdateExist|ebpf.UpdateLock); err != nil {
		return fmt.Errorf("delete tap_rules: %w", err)
	}
	if err := m.Delete(ifindex); err != nil {
		return fmt.Errorf("delete tap_rules: %w", err)
	}
	return nil
}

// Close releases this process's handles. Pinned maps, and their rows, stay.
func (d *Datapath) Close() error { return d.objs.Close() }

// Migrated names the pinned maps Load gave this build's capacity, their
// rows copied.
func (d *Datapath) Migrated() []string { return slices.Clone(d.migrated) }

// PinDir is the folder the maps are pinned in.
func (d *Datapath) PinDir() string { return d.pinDir }

// Program is the TCX ingress program of tenant taps.
func (d *Datapath) Program() *ebpf.Program { return d.objs.TapIngress }

// Tables returns every map of the collection, in a stable order.
func (d *Datapath) Tables() []AnyTable {
	return []AnyTable{d.IfindexVRF, d.TapRules, d.TapFragments, d.TrafficPolicy, d.EgressKind, d.TenantGateway, d.HostOnlyPort, d.Decisions, d.Unattributed}
}

// Table returns the map called name, or ErrUnknownMap.
func (d *Datapath) Table(name string) (AnyTable, error) {
	for _, t := range d.Tables() {
		if t.Name() == name {
			return t, nil
		}
	}
	return nil, fmt.Errorf("map %q: %w", name, ErrUnknownMap)
}

// EnsureBPFFS mounts a bpf filesystem at dir unless one is mounted there.
func EnsureBPFFS(dir string) error {
	if dir == "" {
		return errors.New("bpffs: empty path")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("bpffs %s: %w", dir, err)
	}
	isBPF, err := isBPFFS(dir)
	if err != nil {
		return fmt.Errorf("bpffs %s: statfs: %w", dir, err)
	}
	if isBPF {
		return nil
	}
	if err := mountBPFFS(dir); err != nil {
		return fmt.Errorf("bpffs %s: not a bpf filesystem and mounting one failed: %w", dir, err)
	}
	return nil
}
