package datapath

import (
	"crypto/sha256"
	"encoding/hex"
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
func OpenPinned(bpffs string) (*Datapath, error) {
	spec, err := loadDatapath()
	if err != nil {
		return nil, fmt.Errorf("open datapath: spec: %w", err)
	}
	pinDir, err := pinnedDir(bpffs, spec)
	if err != nil {
		return nil, err
	}
	// The program's own state maps (not pinned) are never used without
	// the program: create them at the smallest size.
	for _, m := range spec.Maps {
		switch {
		case m.Pinning == ebpf.PinByName:
		case m.Type == ebpf.RingBuf:
			m.MaxEntries = uint32(os.Getpagesize()) // a ring's least
		case m.MaxEntries > 1:
			m.MaxEntries = 1
		}
	}
	d := &Datapath{pinDir: pinDir}
	if err := spec.LoadAndAssign(&d.objs.datapathMaps, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}}); err != nil {
		return nil, fmt.Errorf("open datapath maps in %s: %w", pinDir, incompatible(err))
	}
	d.assignTables(spec)
	return d, nil
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
	sum := sha256.Sum256(_DatapathBytes)
	return filepath.Join(ProgramsSubdir, programPinPrefix+hex.EncodeToString(sum[:8]))
}

// pinnedDir checks that bpffs is a bpf filesystem holding every map of spec
// pinned under PinSubdir, and returns that folder.
func pinnedDir(bpffs string, spec *ebpf.CollectionSpec) (string, error) {
	isBPF, err := isBPFFS(bpffs)
	if err != nil {
		return "", fmt.Errorf("%w: bpffs %s: %w", ErrNotPinned, bpffs, err)
	}
	if !isBPF {
		return "", fmt.Errorf("%w: %s is not a bpf filesystem", ErrNotPinned, bpffs)
	}
	pinDir := filepath.Join(bpffs, PinSubdir)
	for name, m := range spec.Maps {
		if m.Pinning != ebpf.PinByName {
			continue
		}
		if _, err := os.Stat(filepath.Join(pinDir, name)); err != nil {
			return "", fmt.Errorf("%w: map %s not under %s (has the node daemon started?)", ErrNotPinned, name, pinDir)
		}
	}
	return pinDir, nil
}

// incompatible marks err with ErrIncompatiblePins when a pinned map's
// layout is what failed.
func incompatible(err error) error {
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return fmt.Errorf("%w: %w", ErrIncompatiblePins, err)
	}
	return err
}
