package attachreg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/cilium/ebpf"
	ciliumlink "github.com/cilium/ebpf/link"

	"github.com/datum-cloud/galactic-node/ebpf/datapath"
	"github.com/datum-cloud/galactic-node/node/identity"
)

// Program is the program one interface's pinned TCX link runs.
type Program struct {
	ID ebpf.ProgramID `json:"id"`
	// Name is the pin under progs/ that holds it, which names the build
	// that attached it; empty when no pin holds it (its pin was removed).
	Name string `json:"name,omitempty"`
	// Current: it is the program of the daemon that answers.
	Current bool `json:"current"`
}

// ProgramSweep is what MoveToCurrentProgram did.
type ProgramSweep struct {
	Links    int // pinned links of existing interfaces
	Moved    int // links moved to the current program
	Copied   int // of those, interfaces whose rows were copied from an older build's
	Other    int // links still on another program (a move failed)
	Unpinned []string
}

// linkProgram is the program of the link pinned for one existing interface.
type linkProgram struct {
	ifindex uint32
	prog    ebpf.ProgramID
	pin     string
}

// linkPrograms reads every pinned TCX link. Links whose device is gone are
// left out: the orphan collection removes them.
func (r *Registry) linkPrograms() ([]linkProgram, error) {
	pins, err := r.linkPins()
	if err != nil {
		return nil, err
	}
	var out []linkProgram
	var errs []error
	for ifindex, pin := range pins {
		prog, live, err := pinnedLinkProgram(pin)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if live {
			out = append(out, linkProgram{ifindex: ifindex, prog: prog, pin: pin})
		}
	}
	slices.SortFunc(out, func(a, b linkProgram) int { return cmp.Compare(a.ifindex, b.ifindex) })
	return out, errors.Join(errs...)
}

func pinnedLinkProgram(pin string) (ebpf.ProgramID, bool, error) {
	l, err := ciliumlink.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil // unpinned meanwhile
	}
	if err != nil {
		return 0, false, fmt.Errorf("load tcx link %s: %w", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return 0, false, fmt.Errorf("tcx link %s: info: %w", pin, err)
	}
	tcx := info.TCX()
	return info.Program, tcx != nil && tcx.Ifindex != 0, nil
}

// Programs returns the program each existing interface's pinned link runs,
// by ifindex, named after the pins under progs/.
func (r *Registry) Programs() (map[uint32]Program, error) {
	links, err := r.linkPrograms()
	program, perr := r.programNamer()
	out := make(map[uint32]Program, len(links))
	for _, l := range links {
		out[l.ifindex] = program(l.prog)
	}
	return out, errors.Join(err, perr)
}

// programOf is the program ifindex's pinned link runs; false when no link
// of an existing device is pinned for it.
func (r *Registry) programOf(ifindex uint32) (Program, bool, error) {
	id, live, err := pinnedLinkProgram(r.linkPin(ifindex))
	if err != nil || !live {
		return Program{}, false, err
	}
	program, err := r.programNamer()
	return program(id), true, err
}

// programNamer returns a function describing a program by its ID.
func (r *Registry) programNamer() (func(ebpf.ProgramID) Program, error) {
	pinned, err := r.dp.PinnedPrograms()
	names := make(map[ebpf.ProgramID]string, len(pinned))
	for _, p := range pinned {
		if p.ID != 0 {
			names[p.ID] = p.Name
		}
	}
	current := r.dp.ProgramID()
	return func(id ebpf.ProgramID) Program {
		return Program{ID: id, Name: names[id], Current: current != 0 && id == current}
	}, err
}

// MoveToCurrentProgram points every existing interface's pinned TCX link at
// this Datapath's program, in place (bpf_link_update): the kernel swaps the
// program under the link, so the interface is never without one. Then it
// unpins the programs under progs/ that no link runs, except its own. A
// link that cannot be moved stays on its program, which stays pinned; the
// error names it, and the next call tries again.
func (r *Registry) MoveToCurrentProgram(ctx context.Context) (ProgramSweep, error) {
	var sweep ProgramSweep
	prog := r.dp.Program()
	current := r.dp.ProgramID()
	if prog == nil || current == 0 {
		return sweep, errors.New("move links to the current program: no program loaded")
	}
	links, err := r.linkPrograms()
	errs := []error{err}
	inUse := map[ebpf.ProgramID]bool{current: true}
	ports := &hostPortIndex{dp: r.dp}
	for _, l := range links {
		if err := ctx.Err(); err != nil {
			return sweep, fmt.Errorf("move links to the current program: %w", err)
		}
		sweep.Links++
		if l.prog == current {
			continue
		}
		// Make before break: the rows this program reads exist before it
		// runs on the tap.
		copied, err := r.copyOlderRows(l.ifindex, ports)
		if err != nil {
			errs = append(errs, fmt.Errorf("interface %d: %w", l.ifindex, err))
			inUse[l.prog] = true
			sweep.Other++
			continue
		}
		if copied {
			sweep.Copied++
		}
		if err := updateLink(l.pin, prog); err != nil {
			errs = append(errs, err)
			inUse[l.prog] = true
			sweep.Other++
			continue
		}
		sweep.Moved++
		r.log.Info("tap moved to the current program", "ifindex", l.ifindex, "from_program", l.prog, "to_program", current)
	}
	pinned, err := r.dp.PinnedPrograms()
	errs = append(errs, err)
	for _, p := range pinned {
		if p.ID == 0 || inUse[p.ID] {
			continue // unreadable pins stay: better kept than lost
		}
		if err := r.dp.UnpinProgram(p.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		sweep.Unpinned = append(sweep.Unpinned, p.Name)
		r.log.Info("program no link runs unpinned", "program", p.Name, "id", p.ID)
	}
	slices.Sort(sweep.Unpinned)
	return sweep, errors.Join(errs...)
}

func updateLink(pin string, prog *ebpf.Program) error {
	l, err := ciliumlink.LoadPinnedLink(pin, nil)
	if err != nil {
		return fmt.Errorf("load tcx link %s: %w", pin, err)
	}
	defer l.Close()
	if err := l.Update(prog); err != nil {
		return fmt.Errorf("update tcx link %s: %w", pin, err)
	}
	return nil
}

// copyOlderRows writes the tap_rules row of an interface that only a build
// older than that map registered, from the rows it left (traffic_policy,
// ifindex_vrf, egress_kind, tenant_gateway, host_only_port): without it this
// build's program would drop every frame of the interface as unregistered.
// Those rows name none of the attachment's addresses, so anti-spoofing stays
// off for it, as it was under the older program, until an ADD registers the
// interface again. An interface with a tap_rules row, or with no older
// policy row, is left as it is (false). The row is created, never replaced:
// an ADD that registers the interface meanwhile wins.
func (r *Registry) copyOlderRows(ifindex uint32, ports *hostPortIndex) (bool, error) {
	d := r.dp
	_, err := d.TapRules.Get(ifindex)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, err
	}
	policy, err := d.TrafficPolicy.Get(ifindex)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, nil // unregistered: every program drops its frames
	}
	if err != nil {
		return false, err
	}
	binding, err := d.IfindexVRF.Get(ifindex)
	if err != nil {
		return false, fmt.Errorf("copy an older build's rows: %w", err)
	}
	egress, err := d.EgressKind.Get(ifindex)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		egress = datapath.EgressTap
	} else if err != nil {
		return false, fmt.Errorf("copy an older build's rows: %w", err)
	}
	gateway, err := d.TenantGateway.Get(ifindex)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, fmt.Errorf("copy an older build's rows: %w", err)
	}
	hostPorts, err := ports.of(ifindex)
	if err != nil {
		return false, fmt.Errorf("copy an older build's rows: %w", err)
	}
	id := IdentityOf(binding.VPC, binding.Attachment)
	reg, unboundWhy := r.boundRegistration(ifindex, id, binding.Table)
	if unboundWhy != "" {
		policy.AllowSpoofing = true
		reg = Registration{Identity: id, Table: binding.Table, Egress: egress, Policy: policy, Gateway: gateway}
		for _, p := range hostPorts {
			reg.HostOnlyPorts = append(reg.HostOnlyPorts, ProtoPort{Protocol: p.Protocol, Port: p.Port})
		}
	}
	if err := reg.validate(ifindex); err != nil {
		return false, fmt.Errorf("copy an older build's rows: %w", err)
	}
	if err := d.TapFragments.Ensure(ifindex); err != nil {
		return false, fmt.Errorf("copy an older build's rows: %w", err)
	}
	rules := reg.Rules(ifindex)
	rules.Unbound = unboundWhy != ""
	if err := d.TapRules.Create(ifindex, rules); errors.Is(err, ebpf.ErrKeyExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("copy an older build's rows: %w", err)
	}
	if rules.Unbound {
		r.log.Warn("an older build's tap taken over unbound: anti-spoofing stays off for it until its pod or VM is added again",
			"ifindex", ifindex, "identity", id.String(), "why", unboundWhy)
	} else {
		r.log.Info("an older build's tap taken over and bound to the MAC and addresses of its ADD, from the runtime's record of it",
			"ifindex", ifindex, "identity", id.String(), "mac", reg.MAC.String(), "addresses", reg.Addresses)
	}
	return true, nil
}

// boundRegistration is what the older build's ADD registered ifindex with,
// from the binding source; why it is not known otherwise ("" when it is).
func (r *Registry) boundRegistration(ifindex uint32, id identity.Identity, table uint32) (Registration, string) {
	if r.Bindings == nil {
		return Registration{}, "no record of its ADD is read on this node"
	}
	reg, err := r.Bindings.Registration(ifindex, id)
	switch {
	case err != nil:
		return Registration{}, err.Error()
	case reg.Identity != id || reg.Table != table:
		return Registration{}, fmt.Sprintf("the record of its ADD names %v in table %d, the tap is %v in table %d", reg.Identity, reg.Table, id, table)
	}
	return reg, ""
}

// hostPortIndex is the host_only_port map by ifindex, dumped once on first
// use: host_only_port is keyed by (ifindex, protocol, port), so one
// interface's rows are a walk, which a sweep over many taps does once.
type hostPortIndex struct {
	dp     *datapath.Datapath
	byTap  map[uint32][]datapath.HostPort
	dumped bool
}

func (x *hostPortIndex) of(ifindex uint32) ([]datapath.HostPort, error) {
	if !x.dumped {
		rows, err := x.dp.HostOnlyPort.Dump(0)
		if err != nil {
			return nil, err
		}
		x.byTap = make(map[uint32][]datapath.HostPort)
		for _, row := range rows {
			x.byTap[row.Key.Ifindex] = append(x.byTap[row.Key.Ifindex], row.Key)
		}
		x.dumped = true
	}
	return x.byTap[ifindex], nil
}
