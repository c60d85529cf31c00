package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
)

// ErrNotPinned: the maps are not pinned at the path given, which is not a
// bpf filesystem or where the node daemon has not started yet.
var ErrNotPinned = errors.New("datapath maps not pinned")

// ErrIncompatiblePins: a pinned map's layout differs from this build's (an
// older or newer daemon pinned it). Its rows cannot be read or cleared by
// this build; callers that only need to remove links (CNI DEL) go on
// without them.
var ErrIncompatiblePins = errors.New("pinned datapath maps are of another layout")

// OpenPinned opens the maps the node daemon pinned under <bpffs>/galactic,
// without loading the program and without mounting or creating anything:
// what CNI DEL, CHECK, GC and STATUS need. A bpffs path with a typo, or one
// the daemon never used, is ErrNotPinned rather than a fresh bpffs whose rows
// nothing reads. Program() is nil on the result.
//
// It checks each pin against this build's table of pinned maps (pins_gen.go,
// generated from the object, which the package's tests hold equal to it),
// as the collection loader would, without parsing the object's ELF and BTF:
// a CNI verb is a process of its own, and that parse was a quarter of its
// time. A pin of another layout is ErrIncompatiblePins, and nothing is
// written to it.
func OpenPinned(bpffs string) (*Datapath, error) {
	pinDir, err := pinFolder(bpffs)
	if err != nil {
		return nil, err
	}
	d := &Datapath{pinDir: pinDir}
	var inner *ebpf.MapSpec
	for _, p := range d.objs.pinnedMaps() {
		m, err := openPin(pinDir, p.spec)
		if err != nil {
			d.Close()
			return nil, err
		}
		*p.into = m
		if p.spec.Name == datapathMapTapFragments {
			inner = p.spec.InnerMap
		}
	}
	d.assignTables(inner)
	return d, nil
}

// pinnedMap is one map the object pins by name: how it declares it, and the
// field of datapathMaps it is opened into.
type pinnedMap struct {
	into **ebpf.Map
	spec *ebpf.MapSpec
}

// openPin opens the pin of spec under pinDir and checks it is of spec's
// layout: what the collection loader checks of a pinned map.
func openPin(pinDir string, spec *ebpf.MapSpec) (*ebpf.Map, error) {
	path := filepath.Join(pinDir, spec.Name)
	m, err := ebpf.LoadPinnedMap(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: map %s not under %s (has the node daemon started?)", ErrNotPinned, spec.Name, pinDir)
	}
	if err != nil {
		return nil, fmt.Errorf("open datapath map %s: %w", path, err)
	}
	if err := spec.Compatible(m); err != nil {
		m.Close()
		return nil, fmt.Errorf("open datapath map %s: %w", path, incompatible(err))
	}
	return m, nil
}

// LoadPinned is Load without mounting a bpffs or creating maps: the maps
// must already be pinned by the node daemon. What CNI ADD uses. The program
// of this build is pinned too, under a name that carries the object's hash,
// so that only the first ADD after an upgrade pays for the verifier; later
// ones open the pin.
func LoadPinned(bpffs string) (*Datapath, error) {
	d, err := OpenPinned(bpffs)
	if err != nil {
		return nil, err
	}
	pin := filepath.Join(d.pinDir, programPinName())
	prog, err := ebpf.LoadPinnedProgram(pin, nil)
	if err == nil {
		d.objs.TapIngress = prog
		return d, nil
	}
	d.Close()
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("load pinned program %s: %w", pin, err)
	}
	d, err = Load(bpffs)
	if err != nil {
		return nil, err
	}
	// Best effort: a concurrent ADD may pin it first, and the next one
	// loads it again if neither did.
	if err := os.MkdirAll(filepath.Dir(pin), 0o700); err == nil {
		_ = d.objs.TapIngress.Pin(pin)
	}
	return d, nil
}

// programPinName names this build's program by the hash of its object.
func programPinName() string {
	return filepath.Join(ProgramsSubdir, programPinPrefix+objectDigest)
}

// pinFolder checks that bpffs is a bpf filesystem and returns the folder
// under it that holds the pins.
func pinFolder(bpffs string) (string, error) {
	isBPF, err := isBPFFS(bpffs)
	if err != nil {
		return "", fmt.Errorf("%w: bpffs %s: %w", ErrNotPinned, bpffs, err)
	}
	if !isBPF {
		return "", fmt.Errorf("%w: %s is not a bpf filesystem", ErrNotPinned, bpffs)
	}
	return filepath.Join(bpffs, PinSubdir), nil
}

// incompatible marks err with ErrIncompatiblePins when a pinned map's
// layout is what failed.
func incompatible(err error) error {
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return fmt.Errorf("%w: %w", ErrIncompatiblePins, err)
	}
	return err
}
