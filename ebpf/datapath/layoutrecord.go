package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
)

// DefaultLayoutRecord is where the node daemon records the layout of the
// maps it pinned: install-cni reads it to refuse a plugin that could not
// write them, without bpf(2), which its container may not call.
const DefaultLayoutRecord = "/run/galactic/datapath-layout"

// PinnedLayout is this build's layout of the pinned maps: a digest of each
// one's name, type, key and value sizes, capacity, flags and inner map. Two
// builds whose digests are equal read and write each other's pins.
func PinnedLayout() (string, error) { return layoutDigest(true) }

// PinnedShape is PinnedLayout without the capacities: pins whose shape is
// this build's but whose layout is not differ by capacity alone, which Load
// migrates.
func PinnedShape() (string, error) { return layoutDigest(false) }

func layoutDigest(capacities bool) (string, error) {
	spec, err := loadDatapath()
	if err != nil {
		return "", fmt.Errorf("datapath layout: spec: %w", err)
	}
	var lines []string
	for name, m := range spec.Maps {
		if m.Pinning != ebpf.PinByName {
			continue
		}
		line := fmt.Sprintf("%s %s %d %d %d", name, m.Type, m.KeySize, m.ValueSize, m.Flags)
		if capacities {
			line += fmt.Sprintf(" %d", m.MaxEntries)
		}
		if in := m.InnerMap; in != nil {
			line += fmt.Sprintf(" inner %s %d %d %d %d", in.Type, in.KeySize, in.ValueSize, in.MaxEntries, in.Flags)
		}
		lines = append(lines, line)
	}
	slices.Sort(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return "v1-" + hex.EncodeToString(sum[:12]), nil
}

// PinnedMapNames names the maps this build pins under PinSubdir.
func PinnedMapNames() ([]string, error) {
	spec, err := loadDatapath()
	if err != nil {
		return nil, fmt.Errorf("datapath maps: spec: %w", err)
	}
	var names []string
	for name, m := range spec.Maps {
		if m.Pinning == ebpf.PinByName {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// RecordLayout writes this build's PinnedLayout and PinnedShape to path,
// one line, written aside and renamed into place. The daemon calls it once
// Load has opened the pins, which proves them of this layout.
func RecordLayout(path string) error {
	layout, err := PinnedLayout()
	if err != nil {
		return err
	}
	shape, err := PinnedShape()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("record datapath layout: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".datapath-layout-")
	if err != nil {
		return fmt.Errorf("record datapath layout: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	_, werr := tmp.WriteString(layout + " " + shape + "\n")
	if err := errors.Join(werr, tmp.Chmod(0o644), tmp.Close()); err != nil {
		return fmt.Errorf("record datapath layout %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("record datapath layout %s: %w", path, err)
	}
	return nil
}
