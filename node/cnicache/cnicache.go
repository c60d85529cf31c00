// Package cnicache reads what a container runtime kept of a CNI ADD: libcni's
// cache of the network configuration, arguments and result it ran an
// attachment with. It is the runtime's own record of what the plugin was
// given, so the node daemon can rebuild an older build's registration of a
// tap exactly as that ADD asked for it.
//
// The format is libcni's (github.com/containernetworking/cni, libcni/api.go:
// cachedInfo, getCacheFilePath, cacheAdd; the same "cniCacheV1" in v1.1.2,
// which containerd 1.6 vendors, and v1.3.1): after a successful ADD, libcni
// writes <cacheDir>/results/<network>-<containerID>-<ifName> holding the
// network's configuration bytes (the whole list for a conflist), the CNI_ARGS
// pairs, the capability arguments and the result. containerd and CRI-O use
// the default cacheDir, /var/lib/cni; Multus runs its delegates through
// libcni with its own, /var/lib/cni/multus (multus-cni v4.2.3,
// pkg/types/conf.go defaultCNIDir, pkg/multus/multus.go
// NewCNIConfigWithCacheDir).
package cnicache

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultDirs are the cache folders libcni's users on a node write: the
// runtime's, and Multus' for the networks it delegates to.
func DefaultDirs() []string { return []string{"/var/lib/cni", "/var/lib/cni/multus"} }

// ErrNotCached: no cache folder holds a record of that attachment.
var ErrNotCached = errors.New("no cached ADD")

// kindV1 is libcni's CNICacheV1.
const kindV1 = "cniCacheV1"

// Entry is libcni's record of one ADD.
type Entry struct {
	Path           string
	Kind           string         `json:"kind"`
	ContainerID    string         `json:"containerId"`
	Config         []byte         `json:"config"`
	IfName         string         `json:"ifName"`
	NetworkName    string         `json:"networkName"`
	CniArgs        [][2]string    `json:"cniArgs,omitempty"`
	CapabilityArgs map[string]any `json:"capabilityArgs,omitempty"`
}

// Read returns the record of network's ADD for (containerID, ifName) from
// the first of dirs that holds one. A record that does not parse, is of
// another kind, or names another attachment is an error, never a match.
func Read(dirs []string, network, containerID, ifName string) (Entry, error) {
	for _, part := range []string{network, containerID, ifName} {
		if part == "" || strings.ContainsAny(part, "/\x00") || part == "." || part == ".." {
			return Entry{}, fmt.Errorf("cached ADD of %q %q %q: not a cache file name", network, containerID, ifName)
		}
	}
	for _, dir := range dirs {
		path := filepath.Join(dir, "results", network+"-"+containerID+"-"+ifName)
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return Entry{}, fmt.Errorf("read cached ADD %s: %w", path, err)
		}
		e := Entry{Path: path}
		if err := json.Unmarshal(b, &e); err != nil {
			return Entry{}, fmt.Errorf("cached ADD %s: %w", path, err)
		}
		if e.Kind != kindV1 || e.ContainerID != containerID || e.IfName != ifName || e.NetworkName != network {
			return Entry{}, fmt.Errorf("cached ADD %s: kind %q of %q %q %q, want %s of %q %q %q", path, e.Kind, e.NetworkName, e.ContainerID, e.IfName, kindV1, network, containerID, ifName)
		}
		return e, nil
	}
	return Entry{}, fmt.Errorf("%w of network %s, container %s, interface %s in %v", ErrNotCached, network, containerID, ifName, dirs)
}

// Args is the CNI_ARGS the plugin was run with, as libcni joins them.
func (e Entry) Args() string {
	pairs := make([]string, len(e.CniArgs))
	for i, kv := range e.CniArgs {
		pairs[i] = kv[0] + "=" + kv[1]
	}
	return strings.Join(pairs, ";")
}

// PluginConfig is the configuration libcni gave the plugin of type
// pluginType: for a list, that plugin's entry with the list's name and
// cniVersion, and a runtimeConfig of the capability arguments it declares
// (libcni's buildOneConfig and injectRuntimeConfig). The previous result
// a chain would pass is left out: the plugin's registration does not read
// it.
func (e Entry) PluginConfig(pluginType string) ([]byte, error) {
	var top map[string]any
	if err := json.Unmarshal(e.Config, &top); err != nil {
		return nil, fmt.Errorf("cached ADD %s: configuration: %w", e.Path, err)
	}
	conf := top
	if plugins, ok := top["plugins"].([]any); ok {
		conf = nil
		for _, p := range plugins {
			if m, ok := p.(map[string]any); ok && m["type"] == pluginType {
				conf = m
				break
			}
		}
		if conf == nil {
			return nil, fmt.Errorf("cached ADD %s: network %s has no %s plugin", e.Path, e.NetworkName, pluginType)
		}
		conf["name"], conf["cniVersion"] = top["name"], top["cniVersion"]
	} else if conf["type"] != pluginType {
		return nil, fmt.Errorf("cached ADD %s: network %s is of type %v, not %s", e.Path, e.NetworkName, conf["type"], pluginType)
	}
	runtime := map[string]any{}
	if caps, ok := conf["capabilities"].(map[string]any); ok {
		for name, on := range caps {
			if v, given := e.CapabilityArgs[name]; given && on == true {
				runtime[name] = v
			}
		}
	}
	if len(runtime) > 0 {
		conf["runtimeConfig"] = runtime
	}
	return json.Marshal(conf)
}
