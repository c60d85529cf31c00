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

// Pins describes the maps this build pins under PinSubdir.
type Pins struct {
	// Layout digests each map's name, type, key and value sizes, capacity,
	// flags and inner map: two builds whose layouts are equal read and
	// write each other's pins.
	Layout string
	// Shape is Layout without the capacities: pins whose shape is this
	// build's but whose layout is not differ by capacity alone, which Load
	// migrates.
	Shape string
	Maps  []string // their names, sorted
}

// ThisBuildsPins describes the maps this build pins, from one read of its
// object.
func ThisBuildsPins() (Pins, error) {
	spec, err := loadDatapath()
	if err != nil {
		return Pins{}, fmt.Errorf("datapath pins: spec: %w", err)
	}
	var p Pins
	var layout, shape []string
	for name, m := range spec.Maps {
		if m.Pinning != ebpf.PinByName {
			continue
		}
		p.Maps = append(p.Maps, name)
		line := fmt.Sprintf("%s %s %d %d %d", name, m.Type, m.KeySize, m.ValueSize, m.Flags)
		inner := ""
		if in := m.InnerMap; in != nil {
			inner = fmt.Sprintf(" inner %s %d %d %d %d", in.Type, in.KeySize, in.ValueSize, in.MaxEntries, in.Flags)
		}
		layout = append(layout, fmt.Sprintf("%s %d%s", line, m.MaxEntries, inner))
		shape = append(shape, line+inner)
	}
	slices.Sort(p.Maps)
	p.Layout, p.Shape = digest(layout), digest(shape)
	return p, nil
}

func digest(lines []string) string {
	slices.Sort(lines)
	sum := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return "v1-" + hex.EncodeToString(sum[:12])
}

// RecordLayout writes this build's Pins.Layout and Pins.Shape to path,
// one line, written aside and renamed into place. The daemon calls it once
// Load has opened the pins, which proves them of this layout.
func RecordLayout(path string) error {
	pins, err := ThisBuildsPins()
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
	_, werr := tmp.WriteString(pins.Layout + " " + pins.Shape + "\n")
	if err := errors.Join(werr, tmp.Chmod(0o644), tmp.Close()); err != nil {
		return fmt.Errorf("record datapath layout %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("record datapath layout %s: %w", path, err)
	}
	return nil
}
