package cnicache

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeEntry writes a cache file as libcni's cacheAdd writes it.
func writeEntry(t *testing.T, dir, name string, e map[string]any) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "results"), 0o700); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(e)
	if err := os.WriteFile(filepath.Join(dir, "results", name), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func entry(network, ctr, ifName string, config string) map[string]any {
	return map[string]any{"kind": "cniCacheV1", "containerId": ctr, "config": []byte(config), "ifName": ifName, "networkName": network,
		"cniArgs": [][2]string{{"IgnoreUnknown", "1"}, {"GALACTIC_VPC", "a"}}, "capabilityArgs": map[string]any{"ips": []string{"10.10.0.3/24"}, "mac": "02:00:00:00:00:03"}}
}

func TestReadFindsTheFirstDirHoldingTheAttachmentAndRefusesAnother(t *testing.T) {
	runtimeDir, multusDir := t.TempDir(), t.TempDir()
	writeEntry(t, multusDir, "galactic-c1-net1", entry("galactic", "c1", "net1", `{"type":"galactic-tap"}`))
	e, err := Read([]string{runtimeDir, multusDir}, "galactic", "c1", "net1")
	if err != nil || e.ContainerID != "c1" || !strings.HasPrefix(e.Path, multusDir) {
		t.Fatalf("Read = %+v, %v; want multus' entry", e, err)
	}
	if e.Args() != "IgnoreUnknown=1;GALACTIC_VPC=a" {
		t.Fatalf("Args = %q", e.Args())
	}
	if _, err := Read([]string{runtimeDir}, "galactic", "c1", "net1"); !errors.Is(err, ErrNotCached) {
		t.Fatalf("Read of a missing entry: %v, want ErrNotCached", err)
	}
	// A file under the attachment's name that records another is no match.
	writeEntry(t, runtimeDir, "galactic-c2-net1", entry("galactic", "c9", "net1", `{}`))
	if _, err := Read([]string{runtimeDir}, "galactic", "c2", "net1"); err == nil || errors.Is(err, ErrNotCached) {
		t.Fatalf("Read of an entry naming another container: %v, want a mismatch", err)
	}
	if err := os.WriteFile(filepath.Join(runtimeDir, "results", "galactic-c3-net1"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read([]string{runtimeDir}, "galactic", "c3", "net1"); err == nil || errors.Is(err, ErrNotCached) {
		t.Fatalf("Read of a malformed entry: %v, want a parse error", err)
	}
	if _, err := Read([]string{runtimeDir}, "../x", "c3", "net1"); err == nil {
		t.Fatal("Read of a name that leaves the folder succeeded")
	}
}

func TestPluginConfigIsWhatLibcniGaveThePlugin(t *testing.T) {
	list := `{"cniVersion":"1.0.0","name":"galactic","plugins":[{"type":"tuning"},` +
		`{"type":"galactic-tap","vpc":"a","capabilities":{"mac":true,"ips":true,"portMappings":true}}]}`
	e := Entry{Path: "p", NetworkName: "galactic", Config: []byte(list),
		CapabilityArgs: map[string]any{"mac": "02:00:00:00:00:03", "ips": []any{"10.10.0.3/24"}, "bandwidth": 1}}
	b, err := e.PluginConfig("galactic-tap")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	rc, _ := got["runtimeConfig"].(map[string]any)
	if got["name"] != "galactic" || got["cniVersion"] != "1.0.0" || got["vpc"] != "a" || rc["mac"] != "02:00:00:00:00:03" || rc["ips"] == nil || rc["bandwidth"] != nil {
		t.Fatalf("plugin config %s: want the list's name and version, and runtimeConfig of the declared capabilities only", b)
	}
	if _, err := e.PluginConfig("bridge"); err == nil {
		t.Fatal("PluginConfig of a type the list lacks succeeded")
	}
}
