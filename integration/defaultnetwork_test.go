package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// defaultNetwork is the network a container runtime gives every pod on a
// node: what containerd's CRI plugin loads through go-cni with its default
// max_conf_num 1 (loadFromConfDir: libcni.ConfFiles for .conf, .conflist
// and .json, sorted, the first read as a conflist or as a single network
// made a list). CRI-O's ocicni keeps the same order; Multus' generated
// 00-multus.conf delegates to the first file it finds the same way.
type defaultNetwork struct {
	File    string // its file's name in the folder; empty: none, and no pod starts
	Network string
	Type    string // its first plugin's type
	Bytes   string
}

func (d defaultNetwork) String() string {
	if d.File == "" {
		return "none"
	}
	return fmt.Sprintf("%s (network %q, plugin %s)", d.File, d.Network, d.Type)
}

func runtimeDefault(t *testing.T, dir string) defaultNetwork {
	t.Helper()
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		return defaultNetwork{}
	}
	sort.Strings(files)
	first := files[0]
	var list *libcni.NetworkConfigList
	if strings.HasSuffix(first, ".conflist") {
		list, err = libcni.ConfListFromFile(first)
	} else {
		var conf *libcni.NetworkConfig
		if conf, err = libcni.ConfFromFile(first); err == nil { //nolint:staticcheck // single-plugin .conf files are what containerd's go-cni and Multus still read
			if conf.Network.Type == "" {
				t.Fatalf("%s: no network type", first)
			}
			list, err = libcni.ConfListFromConf(conf) //nolint:staticcheck // single-plugin .conf files are what containerd's go-cni and Multus still read
		}
	}
	if err != nil {
		t.Fatalf("the runtime cannot load its default network %s: %v", first, err)
	}
	if len(list.Plugins) == 0 {
		t.Fatalf("%s has no plugins", first)
	}
	b, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	return defaultNetwork{File: filepath.Base(first), Network: list.Name, Type: list.Plugins[0].Network.Type, Bytes: string(b)}
}

// tree is every file under dir, by path relative to it, with its mode and
// bytes.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		var b []byte
		if d.Type().IsRegular() {
			if b, err = os.ReadFile(path); err != nil {
				return err
			}
		}
		out[rel] = info.Mode().String() + " " + string(b)
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return out
}

func treeNames(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// copyTree copies the files under src into dst, as a node's folder.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// multusConfByName finds a network in Multus' configuration folder as
// Multus does for a NetworkAttachmentDefinition with no spec.config
// (netutils.GetCNIConfig, then GetCNIConfigFromFile of the
// network-attachment-definition-client): the first .conf, .json or
// .conflist file, in libcni's order, whose network has the definition's
// name.
func multusConfByName(t *testing.T, dir, name string) defaultNetwork {
	t.Helper()
	files, err := libcni.ConfFiles(dir, []string{".conf", ".json", ".conflist"})
	if err != nil || len(files) == 0 {
		t.Fatalf("no networks in %s: %v", dir, err)
	}
	for _, f := range files {
		var list *libcni.NetworkConfigList
		if strings.HasSuffix(f, ".conflist") {
			list, err = libcni.ConfListFromFile(f)
		} else {
			var conf *libcni.NetworkConfig
			if conf, err = libcni.ConfFromFile(f); err == nil { //nolint:staticcheck // single-plugin .conf files are what containerd's go-cni and Multus still read
				list, err = libcni.ConfListFromConf(conf) //nolint:staticcheck // single-plugin .conf files are what containerd's go-cni and Multus still read
			}
		}
		if err != nil {
			t.Fatalf("Multus cannot load %s: %v", f, err)
		}
		if list.Name == name && len(list.Plugins) > 0 {
			return defaultNetwork{File: filepath.Base(f), Network: list.Name, Type: list.Plugins[0].Network.Type}
		}
	}
	return defaultNetwork{}
}

// hostCNIFolders makes a host's CNI configuration and plugin folders, the
// first holding system's files from testdata/net.d (none for "").
func hostCNIFolders(t *testing.T, system string) (netd, bin string) {
	t.Helper()
	host := t.TempDir()
	netd, bin = filepath.Join(host, "etc/cni/net.d"), filepath.Join(host, "opt/cni/bin")
	if err := os.MkdirAll(netd, 0o755); err != nil {
		t.Fatal(err)
	}
	if system != "" {
		copyTree(t, filepath.Join("testdata/net.d", system), netd)
	}
	return netd, bin
}

// olderConflist is what an older install-cni left in the runtime's folder
// (node/cniinstall's test data, byte for byte what deploy/ shipped up to
// 9d7a55f).
var olderConflist = func() string {
	b, err := os.ReadFile("../node/cniinstall/testdata/older-10-galactic.conflist")
	if err != nil {
		panic(err)
	}
	return string(b)
}()

// installCNI runs the built galactic-node install-cni as the DaemonSet's
// init container runs it, the network's conflist the one deploy/ ships,
// with the host folders of a stand-in node.
func installCNI(t *testing.T, binDir, confDir string, extra ...string) (string, error) {
	t.Helper()
	args := append([]string{"install-cni", "--plugin", tapPlugin, "--conflist", "../deploy/node/10-galactic.conflist",
		"--cni-bin-dir", binDir, "--cni-conf-dir", confDir,
		"--seccomp-profile=", "--seccomp-dir=", "--cli=", "--cli-dir=", "--log-format", "text"}, extra...)
	var stderr bytes.Buffer
	cmd := exec.Command(binary, args...)
	cmd.Stderr = &stderr
	err := cmd.Run()
	return stderr.String(), err
}

// TestInstallCNIKeepsTheRuntimesDefaultNetwork runs the built install-cni,
// twice, over the configuration folders other systems leave on a node (and
// over an empty one: a node at bootstrap, before its primary network wrote
// its file), and reads the folder as the runtime does: the network every
// pod gets must be the one it got before, and the folder must hold what it
// held. galactic is a secondary network; its configuration goes to Multus.
func TestInstallCNIKeepsTheRuntimesDefaultNetwork(t *testing.T) {
	systems := []string{"", "cilium", "flannel", "calico", "kindnet", "podman", "multus"}
	for _, system := range systems {
		name := system
		if name == "" {
			name = "empty folder at bootstrap"
		}
		t.Run(name, func(t *testing.T) {
			netd, bin := hostCNIFolders(t, system)
			before, beforeTree := runtimeDefault(t, netd), tree(t, netd)
			for run := 1; run <= 2; run++ {
				log, err := installCNI(t, bin, netd)
				if err != nil {
					t.Fatalf("install-cni run %d: %v\n%s", run, err, log)
				}
				if after := runtimeDefault(t, netd); after != before {
					t.Fatalf("install-cni run %d changed every pod's network from %s to %s\n%s", run, before, after, log)
				}
				if afterTree := tree(t, netd); fmt.Sprint(afterTree) != fmt.Sprint(beforeTree) {
					t.Fatalf("install-cni run %d changed the runtime's folder: %v, then %v\n%s", run, treeNames(beforeTree), treeNames(afterTree), log)
				}
				if fi, err := os.Stat(filepath.Join(bin, "galactic-tap")); err != nil || fi.Mode().Perm() != 0o755 {
					t.Fatalf("install-cni run %d left no plugin: %v", run, err)
				}
				if strings.Contains(log, "level=WARN") {
					t.Errorf("install-cni run %d warned on a sound folder:\n%s", run, log)
				}
			}
		})
	}

	// A node an older install-cni left with galactic as every pod's
	// network (alone at bootstrap, or sorting before kindnet): the upgrade
	// gives the primary network back. Beside calico, which sorts first,
	// the older file did no harm, and goes all the same.
	for _, c := range []struct {
		system         string
		galacticsFirst bool
	}{{"", true}, {"kindnet", true}, {"calico", false}} {
		system, name := c.system, c.system
		if name == "" {
			name = "alone"
		}
		t.Run("upgrade over an older install, "+name, func(t *testing.T) {
			netd, bin := hostCNIFolders(t, system)
			want, wantTree := runtimeDefault(t, netd), tree(t, netd)
			if err := os.WriteFile(filepath.Join(netd, "10-galactic.conflist"), []byte(olderConflist), 0o644); err != nil {
				t.Fatal(err)
			}
			if broken := runtimeDefault(t, netd); (broken.Type == "galactic-tap") != c.galacticsFirst {
				t.Fatalf("the older install's scene: every pod's network is %s", broken)
			}
			log, err := installCNI(t, bin, netd)
			if err != nil {
				t.Fatalf("install-cni: %v\n%s", err, log)
			}
			if got := runtimeDefault(t, netd); got != want {
				t.Fatalf("after the upgrade every pod's network is %s, want %s\n%s", got, want, log)
			}
			if got := tree(t, netd); fmt.Sprint(got) != fmt.Sprint(wantTree) {
				t.Fatalf("after the upgrade the runtime's folder holds %v, want %v", treeNames(got), treeNames(wantTree))
			}
			for _, want := range []string{"level=WARN", "removed the conflist an older install put", "every pod"} {
				if !strings.Contains(log, want) {
					t.Errorf("the upgrade's log lacks %q:\n%s", want, log)
				}
			}
		})
	}

	// Asked for Multus' folder, the conflist goes there, where Multus
	// finds a network by name, and the runtime's default is untouched.
	t.Run("Multus' folder", func(t *testing.T) {
		netd, bin := hostCNIFolders(t, "multus")
		multus := filepath.Join(filepath.Dir(netd), "multus/net.d")
		before, beforeTree := runtimeDefault(t, netd), tree(t, netd)
		log, err := installCNI(t, bin, netd, "--multus-conf-dir", multus)
		if err != nil {
			t.Fatalf("install-cni: %v\n%s", err, log)
		}
		if after := runtimeDefault(t, netd); after != before || fmt.Sprint(tree(t, netd)) != fmt.Sprint(beforeTree) {
			t.Fatalf("every pod's network went from %s to %s", before, after)
		}
		// A NetworkAttachmentDefinition named galactic with no spec.config
		// is Multus' way to this file.
		if got := multusConfByName(t, multus, "galactic"); got.Type != "galactic-tap" {
			t.Fatalf("Multus finds %s in its folder, want galactic's network", got)
		}
	})

	// Asked for the runtime's folder, the conflist goes there, and the log
	// says at warning level what that does.
	t.Run("the runtime's folder, asked", func(t *testing.T) {
		host := t.TempDir()
		netd, bin := filepath.Join(host, "etc/cni/net.d"), filepath.Join(host, "opt/cni/bin")
		log, err := installCNI(t, bin, netd, "--conflist-into-default-network-dir")
		if err != nil {
			t.Fatalf("install-cni: %v\n%s", err, log)
		}
		if got := runtimeDefault(t, netd); got.Type != "galactic-tap" {
			t.Fatalf("every pod's network is %s, want galactic's as asked", got)
		}
		for _, want := range []string{"level=WARN", "why_dangerous=", "every pod"} {
			if !strings.Contains(log, want) {
				t.Errorf("the log lacks %q:\n%s", want, log)
			}
		}
	})
}
