package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// containerd16CNI is the libcni that containerd 1.6 runs with (Debian 12's
// containerd 1.6.20 is built against golang-github-containernetworking-cni
// 1.1.2): it reads CNI results up to version 1.0.0.
const containerd16CNI = "v1.1.2"

// oldRuntimeSource drives one CNI verb of a conflist through the libcni of
// containerd16CNI, as containerd 1.6's CRI plugin does, with its own result
// cache (cnitool would write into the host's /var/lib/cni).
const oldRuntimeSource = `package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

func main() {
	verb, conflist, netns, container, cache, path, args := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5], os.Args[6], os.Args[7]
	list, err := libcni.ConfListFromFile(conflist)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	rt := &libcni.RuntimeConf{ContainerID: container, NetNS: netns, IfName: "net1"}
	for _, kv := range strings.Split(args, ";") {
		k, v, _ := strings.Cut(kv, "=")
		rt.Args = append(rt.Args, [2]string{k, v})
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{path}, cache, nil)
	ctx := context.Background()
	switch verb {
	case "add":
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err == nil {
			err = res.Print()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "check":
		err = cni.CheckNetworkList(ctx, list, rt)
	case "del":
		err = cni.DelNetworkList(ctx, list, rt)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
`

var (
	oldRuntimeOnce sync.Once
	oldRuntimeBin  string
	oldRuntimeErr  error
)

// oldRuntime builds the containerd 1.6 stand-in once per test binary.
func oldRuntime(t *testing.T) string {
	t.Helper()
	oldRuntimeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "galactic-old-libcni-")
		if err != nil {
			oldRuntimeErr = err
			return
		}
		mod := "module oldruntime\n\ngo 1.21\n\nrequire github.com/containernetworking/cni " + containerd16CNI + "\n"
		for name, body := range map[string]string{"go.mod": mod, "main.go": oldRuntimeSource} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				oldRuntimeErr = err
				return
			}
		}
		oldRuntimeBin = filepath.Join(dir, "oldruntime")
		cmd := exec.Command("go", "build", "-o", oldRuntimeBin, ".")
		cmd.Dir, cmd.Env = dir, append(os.Environ(), "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			oldRuntimeErr = fmt.Errorf("build the libcni %s runtime: %w: %s", containerd16CNI, err, out)
		}
	})
	if oldRuntimeErr != nil {
		t.Fatal(oldRuntimeErr)
	}
	return oldRuntimeBin
}

// The shipped network runs under containerd 1.6's libcni: its cniVersion
// is one that libcni reads results of (1.1.0 gave "unsupported CNI result
// version"), and ADD, CHECK and DEL all work through it.
func TestTheShippedConflistRunsUnderContainerd16(t *testing.T) {
	h := newCNIHost(t)
	b, err := os.ReadFile("../deploy/node/10-galactic.conflist")
	if err != nil {
		t.Fatal(err)
	}
	var list map[string]any
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	// Only where things are on this test host, the bridge standing in for
	// the VRF this kernel lacks, and the attachment's address (a VM's own
	// definition gives it as routes; the plugin refuses an attachment
	// without one).
	tap := list["plugins"].([]any)[0].(map[string]any)
	for k, v := range map[string]any{"bpffs": h.bpffs, "vrfLockDir": h.locks, "dataDir": h.dataDir, "master": "bridge", "routes": routesOf("k")} {
		tap[k] = v
	}
	conflist := filepath.Join(t.TempDir(), "galactic.conflist")
	b, _ = json.Marshal(list)
	if err := os.WriteFile(conflist, b, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := os.Symlink(tapPlugin, filepath.Join(bin, "galactic-tap")); err != nil {
		t.Fatal(err)
	}
	cache := t.TempDir()
	run := func(verb string) (string, error) {
		cmd := exec.Command("ip", "netns", "exec", h.host.Name, oldRuntime(t), verb, conflist, "/run/netns/"+h.ctr.Name, ctrA, cache, bin,
			"IgnoreUnknown=1;K8S_POD_NAME=vm-1;GALACTIC_VPC=a;GALACTIC_VPC_ATTACHMENT=k")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return out.String(), fmt.Errorf("%s: %w: %s", verb, err, strings.TrimSpace(errb.String()))
		}
		return out.String(), nil
	}
	out, err := run("add")
	if err != nil {
		t.Fatalf("containerd 1.6's libcni %s: %v", containerd16CNI, err)
	}
	if !strings.Contains(out, tapName("k")) {
		t.Fatalf("ADD result %s does not name the tap", out)
	}
	if _, err := run("check"); err != nil {
		t.Fatal(err)
	}
	if _, err := run("del"); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.link(tapName("k")); ok {
		t.Fatal("DEL left the tap")
	}
}
