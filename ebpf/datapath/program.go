package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
)

// ProgramsSubdir holds, under the pin folder, one pinned program per build
// that attached taps: tap_ingress_<first 8 bytes of the object's SHA-256>.
const ProgramsSubdir = "progs"

// programPinPrefix begins the name of every program pin under
// ProgramsSubdir.
const programPinPrefix = "tap_ingress_"

// ProgramName is the pin name of this build's program, which names its
// build: the same on every node that runs the same object.
func ProgramName() string { return filepath.Base(programPinName()) }

// AdoptProgram makes the program this Datapath runs the one pinned under
// this build's name, so that the taps CNI ADD attaches (LoadPinned) and the
// ones the daemon moves run the very same program, one program ID per node.
// A pin of this build over other maps (its state maps were removed and made
// again) is replaced: its taps would read maps no daemon writes. What the
// node daemon calls after Load.
func (d *Datapath) AdoptProgram() error {
	own := d.objs.TapIngress
	if own == nil {
		return errors.New("adopt program: no program loaded")
	}
	pin := filepath.Join(d.pinDir, programPinName())
	pinned, err := ebpf.LoadPinnedProgram(pin, nil)
	switch {
	case err == nil:
		same, err := d.usesPinnedMaps(pinned)
		if err != nil {
			_ = pinned.Close()
			return fmt.Errorf("adopt program %s: %w", pin, err)
		}
		if same {
			_ = own.Close()
			d.objs.TapIngress = pinned
			return nil
		}
		_ = pinned.Close()
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("adopt program: unpin %s, which reads other maps: %w", pin, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("adopt program: load %s: %w", pin, err)
	}
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err != nil {
		return fmt.Errorf("adopt program: %w", err)
	}
	if err := own.Pin(pin); err != nil {
		return fmt.Errorf("adopt program: pin %s: %w", pin, err)
	}
	return nil
}

// usesPinnedMaps tells whether p uses the same pinned maps (row maps and
// state maps) as this Datapath's own program: a program loaded over maps
// since removed and made again would judge frames by rows no one writes.
// Maps private to each load (scratch space) are not compared.
func (d *Datapath) usesPinnedMaps(p *ebpf.Program) (bool, error) {
	spec, err := loadDatapath()
	if err != nil {
		return false, fmt.Errorf("spec: %w", err)
	}
	shared := map[ebpf.MapID]bool{}
	for name, m := range spec.Maps {
		pin := filepath.Join(d.pinDir, name)
		switch {
		case slices.Contains(stateMapNames, name):
			pin = filepath.Join(d.pinDir, StateSubdir, name)
		case m.Pinning != ebpf.PinByName:
			continue
		}
		id, err := pinnedMapID(pin)
		if err != nil {
			return false, err
		}
		shared[id] = true
	}
	sharedOf := func(p *ebpf.Program) ([]ebpf.MapID, error) {
		info, err := p.Info()
		if err != nil {
			return nil, fmt.Errorf("program info: %w", err)
		}
		ids, ok := info.MapIDs()
		if !ok {
			return nil, errors.New("the kernel does not report a program's maps")
		}
		ids = slices.DeleteFunc(ids, func(id ebpf.MapID) bool { return !shared[id] })
		slices.Sort(ids)
		return ids, nil
	}
	own, err := sharedOf(d.objs.TapIngress)
	if err != nil {
		return false, err
	}
	theirs, err := sharedOf(p)
	if err != nil {
		return false, err
	}
	return slices.Equal(own, theirs), nil
}

func pinnedMapID(pin string) (ebpf.MapID, error) {
	m, err := ebpf.LoadPinnedMap(pin, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("load pinned map %s: %w", pin, err)
	}
	defer func() { _ = m.Close() }()
	info, err := m.Info()
	if err != nil {
		return 0, fmt.Errorf("pinned map %s: info: %w", pin, err)
	}
	id, _ := info.ID()
	return id, nil
}

// PinnedProgram is one program pinned under ProgramsSubdir.
type PinnedProgram struct {
	Name string         // the pin's name: the build that pinned it
	ID   ebpf.ProgramID // 0 when it could not be read
}

// PinnedPrograms lists the programs pinned under ProgramsSubdir. A pin that
// cannot be opened is listed with ID 0 and its error joined to the result.
func (d *Datapath) PinnedPrograms() ([]PinnedProgram, error) {
	dir := filepath.Join(d.pinDir, ProgramsSubdir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pinned programs: %w", err)
	}
	var out []PinnedProgram
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), programPinPrefix) {
			continue
		}
		p := PinnedProgram{Name: e.Name()}
		if id, err := pinnedProgramID(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		} else {
			p.ID = id
		}
		out = append(out, p)
	}
	return out, errors.Join(errs...)
}

func pinnedProgramID(pin string) (ebpf.ProgramID, error) {
	p, err := ebpf.LoadPinnedProgram(pin, nil)
	if err != nil {
		return 0, fmt.Errorf("load pinned program %s: %w", pin, err)
	}
	defer func() { _ = p.Close() }()
	info, err := p.Info()
	if err != nil {
		return 0, fmt.Errorf("pinned program %s: info: %w", pin, err)
	}
	id, _ := info.ID()
	return id, nil
}

// UnpinProgram removes the pin called name under ProgramsSubdir. The
// program lives on while a link or a process holds it.
func (d *Datapath) UnpinProgram(name string) error {
	if !strings.HasPrefix(name, programPinPrefix) || strings.ContainsRune(name, '/') {
		return fmt.Errorf("unpin program %q: not a program pin", name)
	}
	if err := os.Remove(filepath.Join(d.pinDir, ProgramsSubdir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("unpin program %s: %w", name, err)
	}
	return nil
}

// ProgramID is the kernel's ID of the program this Datapath runs; 0 when
// it has none (OpenPinned) or it cannot be read.
func (d *Datapath) ProgramID() ebpf.ProgramID {
	if d.objs.TapIngress == nil {
		return 0
	}
	info, err := d.objs.TapIngress.Info()
	if err != nil {
		return 0
	}
	id, _ := info.ID()
	return id
}
