package cnicache

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/datum-cloud/galactic-node/node/attachreg"
	"github.com/datum-cloud/galactic-node/node/cnitap"
	"github.com/datum-cloud/galactic-node/node/identity"
)

// pluginType is the plugin whose configuration a record's network holds.
const pluginType = "galactic-tap"

// Binder rebuilds the registration an older build's ADD made for a tap:
// the plugin's record of that ADD names its network, container and
// interface; the runtime's cache of it holds the configuration and
// arguments; the plugin's own parser turns them into the registration
// this build's ADD would write. It is an attachreg.BindingSource.
type Binder struct {
	// DataDir is the plugin's folder of records (cnitap.DefaultDataDir).
	DataDir string
	// CacheDirs are libcni's cache folders (DefaultDirs).
	CacheDirs []string
	// Owner returns the tap's name and owner stamp (its alias: the
	// container its ADD was for).
	Owner func(ifindex uint32) (name, stamp string, err error)
}

// ErrNoRecord: the plugin kept no record of the tap's ADD for its owner.
var ErrNoRecord = errors.New("no record of the tap's ADD")

// Registration implements attachreg.BindingSource.
func (b Binder) Registration(ifindex uint32, id identity.Identity) (attachreg.Registration, error) {
	name, stamp, err := b.Owner(ifindex)
	if err != nil {
		return attachreg.Registration{}, fmt.Errorf("bind interface %d: %w", ifindex, err)
	}
	if stamp == "" {
		return attachreg.Registration{}, fmt.Errorf("bind tap %s: it has no owner stamp", name)
	}
	recs, err := cnitap.RecordsOfTap(b.DataDir, name, stamp)
	if err != nil {
		return attachreg.Registration{}, fmt.Errorf("bind tap %s: %w", name, err)
	}
	if len(recs) == 0 {
		// Builds before the plugin kept records: the runtime's cache of
		// every ADD for the container, each read for the tap's identity.
		if recs, err = b.cachedOf(stamp); err != nil {
			return attachreg.Registration{}, fmt.Errorf("bind tap %s: %w", name, err)
		}
	}
	if len(recs) == 0 {
		return attachreg.Registration{}, fmt.Errorf("bind tap %s: %w for container %s in %s, nor a cached ADD in %v", name, ErrNoRecord, stamp, b.DataDir, b.CacheDirs)
	}
	var errs []error
	for _, rec := range recs {
		reg, err := b.fromCache(rec)
		if err == nil && reg.Identity == id {
			return reg, nil
		}
		if err == nil {
			err = fmt.Errorf("the cached ADD names %v, the tap is %v", reg.Identity, id)
		}
		errs = append(errs, err)
	}
	return attachreg.Registration{}, fmt.Errorf("bind tap %s: %w", name, errors.Join(errs...))
}

func (b Binder) fromCache(rec cnitap.Record) (attachreg.Registration, error) {
	e, err := Read(b.CacheDirs, rec.Network, rec.ContainerID, rec.IfName)
	if err != nil {
		return attachreg.Registration{}, err
	}
	conf, err := e.PluginConfig(pluginType)
	if err != nil {
		return attachreg.Registration{}, err
	}
	reg, err := cnitap.Registration(conf, e.Args(), rec.ContainerID, rec.IfName)
	if err != nil {
		return attachreg.Registration{}, fmt.Errorf("cached ADD %s: %w", e.Path, err)
	}
	return reg, nil
}

// cachedOf lists the cached ADDs of container, as records: libcni names
// each <network>-<container>-<ifName>, and a container ID holds no "-".
func (b Binder) cachedOf(container string) ([]cnitap.Record, error) {
	var out []cnitap.Record
	for _, dir := range b.CacheDirs {
		paths, err := filepath.Glob(filepath.Join(dir, "results", "*-"+container+"-*"))
		if err != nil {
			return nil, fmt.Errorf("find cached ADDs of %s: %w", container, err)
		}
		for _, p := range paths {
			network, ifName, ok := strings.Cut(filepath.Base(p), "-"+container+"-")
			if ok && network != "" && ifName != "" {
				out = append(out, cnitap.Record{Network: network, ContainerID: container, IfName: ifName})
			}
		}
	}
	return out, nil
}
