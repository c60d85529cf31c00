package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ErrNotPinned: the maps are not pinned at the path given, which is not a
// bpf filesystem or where the node daemon has not started yet.
var ErrNotPinned = errors.New("datapath maps not pinned")

// OpenPinned opens the maps the node daemon pinned under <bpffs>/galactic,
// without loading the program and without mounting or creating anything:
// what CNI DEL, CHECK, GC and STATUS need. A bpffs path with a typo, or one
// the daemon never used, is ErrNotPinned rather than a fresh bpffs whose rows
// nothing reads. Program() is nil on the result.
func OpenPinned(bpffs string) (*Datapath, error) {
	pinDir, err := pinnedDir(bpffs)
	if err != nil {
		return nil, err
	}
	spec, err := loadDatapath()
	if err != nil {
		return nil, fmt.Errorf("open datapath: spec: %w", err)
	}
	d := &Datapath{pinDir: pinDir}
	if err := spec.LoadAndAssign(&d.objs.datapathMaps, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}}); err != nil {
		return nil, fmt.Errorf("open datapath maps in %s: %w", pinDir, err)
	}
	d.assignTables()
	return d, nil
}

// LoadPinned is Load without mounting a bpffs or creating maps: the maps
// must already be pinned by the node daemon. What CNI ADD uses.
func LoadPinned(bpffs string) (*Datapath, error) {
	if _, err := pinnedDir(bpffs); err != nil {
		return nil, err
	}
	return Load(bpffs)
}

// pinnedDir checks that bpffs is a bpf filesystem holding every map of this
// build pinned under PinSubdir, and returns that folder.
func pinnedDir(bpffs string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(bpffs, &st); err != nil {
		return "", fmt.Errorf("%w: bpffs %s: %w", ErrNotPinned, bpffs, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return "", fmt.Errorf("%w: %s is not a bpf filesystem", ErrNotPinned, bpffs)
	}
	pinDir := filepath.Join(bpffs, PinSubdir)
	spec, err := loadDatapath()
	if err != nil {
		return "", fmt.Errorf("open datapath: spec: %w", err)
	}
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
