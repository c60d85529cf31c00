// Package cniinstall installs the CNI plugin into the host's plugin folder,
// the network's conflist where Multus reads secondary networks when asked,
// the daemon's seccomp profile where the kubelet reads Localhost profiles,
// and the operator CLI (galactic-node itself) on the host. Each file is
// replaced by a rename, so the container runtime, which may read either at
// any moment, sees the old file or the new one and never a part of one.
//
// galactic is a secondary network. containerd (max_conf_num 1), CRI-O and
// Multus' generated configuration take the first file of the runtime's
// configuration folder (/etc/cni/net.d), by name, as the network of every
// pod; a galactic conflist there would sort before most primary networks'
// (10-kindnet, 10-calico, 87-podman-bridge) and be the only file at all at
// node bootstrap, and every pod without a galactic attachment identity
// would then fail to start. So the conflist goes into that folder only when
// asked, and a conflist an older install left there is removed.
package cniinstall

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

// PluginType is the type galactic's network names its plugin by: a
// conflist whose first plugin has it is galactic's.
const PluginType = "galactic-tap"

// whyNotDefault is what every warning about the runtime's configuration
// folder says, so an operator reading one line of the log knows the harm.
const whyNotDefault = "containerd, CRI-O and Multus' generated configuration take the first file of this folder, by name, as the network of every pod on the node; galactic's ADD fails for a pod with no galactic attachment identity, so no such pod could start"

// Config names the sources and the destination folders.
type Config struct {
	Plugin string // the plugin binary to install
	BinDir string // the host's CNI plugin folder

	// Conflist is the network's conflist. It is installed only into
	// MultusConfDir, and into ConfDir with IntoConfDir; it also names the
	// file an older install left in ConfDir. Empty: no conflist is
	// installed, and none is removed.
	Conflist string
	// ConfDir is the container runtime's CNI configuration folder, whose
	// first file is every pod's network. Nothing is written there unless
	// IntoConfDir asks; a conflist of Conflist's name and network that an
	// older install left there is removed.
	ConfDir string
	// IntoConfDir installs the conflist into ConfDir all the same, with a
	// warning in the log: for a node whose pods all carry a galactic
	// attachment identity, and whose primary network sorts first.
	IntoConfDir bool
	// MultusConfDir is Multus' own configuration folder (its confDir,
	// /etc/cni/multus/net.d by default), where a NetworkAttachmentDefinition
	// with no spec.config finds its network by name. Empty installs none.
	MultusConfDir string

	// Seccomp is the daemon's seccomp profile, installed into SeccompDir
	// (the kubelet's seccomp folder, or a folder under it) before the
	// daemon's container is created; both empty installs none.
	Seccomp, SeccompDir string
	// CLI is the galactic-node binary, installed into CLIDir so that the
	// runbooks' commands run on the node itself; both empty installs none.
	CLI, CLIDir string

	// PinDir is where the node daemon pins the datapath's maps (the
	// host's /sys/fs/bpf/galactic, mounted read-only), PinnedMaps the
	// names this build pins there, Layout their layout and Shape their
	// layout without capacities (datapath.ThisBuildsPins);
	// LayoutRecord is the file where the daemon that pinned them recorded
	// theirs. When maps are pinned and the record names another layout of
	// another shape, nothing is installed (ErrLayoutDiffers): this build's
	// plugin could not add a tap to them, nor its daemon migrate them.
	// Empty PinDir: no check.
	PinDir, LayoutRecord, Layout, Shape string
	PinnedMaps                          []string
}

// ErrLayoutDiffers: the maps pinned on the node are of another layout than
// this build's.
var ErrLayoutDiffers = errors.New("the pinned datapath maps are of another layout than this build's")

// Check refuses a configuration that cannot be what its operator meant,
// before any file is read.
func (c Config) Check() error {
	if c.Plugin == "" || c.BinDir == "" {
		return errors.New("the plugin and the CNI plugin folder are both required")
	}
	if (c.Seccomp == "") != (c.SeccompDir == "") {
		return errors.New("a seccomp profile and its folder go together")
	}
	if (c.CLI == "") != (c.CLIDir == "") {
		return errors.New("the CLI binary and its folder go together")
	}
	if c.IntoConfDir && c.ConfDir == "" {
		return errors.New("installing the conflist into the runtime's configuration folder needs that folder")
	}
	if c.PinDir != "" && c.LayoutRecord == "" {
		return errors.New("checking the pinned maps' layout needs the file the daemon records it in")
	}
	if (c.IntoConfDir || c.MultusConfDir != "") && c.Conflist == "" {
		return errors.New("installing the conflist needs a conflist")
	}
	// Multus' folder named as the runtime's would put the conflist where
	// it becomes every pod's network without the warning that says so.
	if c.MultusConfDir != "" && c.ConfDir != "" && sameFolder(c.MultusConfDir, c.ConfDir) {
		return fmt.Errorf("the Multus configuration folder %s is the runtime's configuration folder, whose first file is every pod's network: name Multus' own folder (its confDir), or ask for the runtime's folder explicitly", c.MultusConfDir)
	}
	return nil
}

// sameFolder says whether a and b name one folder, by path or, when both
// exist, by inode (a bind mount or a symlink may join them).
func sameFolder(a, b string) bool {
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}

// Installed is one file as it now is at its destination.
type Installed struct {
	Path    string
	Bytes   int64
	SHA256  string
	Changed bool // false when the destination already held these bytes and mode
}

// Install checks every source, then removes a conflist an older install
// left in the runtime's configuration folder, then installs the plugin
// and, after it, the conflist where asked, the CLI and the seccomp
// profile. Nothing is changed unless every source is sound. Running it
// again with the same sources changes nothing.
func Install(ctx context.Context, c Config, log *slog.Logger) ([]Installed, error) {
	if err := c.Check(); err != nil {
		return nil, err
	}
	var network *libcni.NetworkConfigList
	if c.Conflist != "" {
		conf, err := os.ReadFile(c.Conflist)
		if err != nil {
			return nil, fmt.Errorf("read conflist: %w", err)
		}
		if network, err = validateConflist(conf); err != nil {
			return nil, fmt.Errorf("conflist %s: %w", c.Conflist, err)
		}
	}
	if err := checkPlugin(c.Plugin); err != nil {
		return nil, err
	}
	if err := checkLayout(c, log); err != nil {
		return nil, err
	}
	type file struct {
		src, dir string
		mode     fs.FileMode
		warn     bool // into the runtime's configuration folder
	}
	// The plugin goes first: a runtime that finds the conflist must find
	// the plugin it names.
	files := []file{{src: c.Plugin, dir: c.BinDir, mode: 0o755}}
	if c.MultusConfDir != "" {
		files = append(files, file{src: c.Conflist, dir: c.MultusConfDir, mode: 0o644})
	}
	if c.IntoConfDir {
		files = append(files, file{src: c.Conflist, dir: c.ConfDir, mode: 0o644, warn: true})
	}
	if c.CLI != "" {
		if err := checkPlugin(c.CLI); err != nil {
			return nil, fmt.Errorf("CLI: %w", err)
		}
		files = append(files, file{src: c.CLI, dir: c.CLIDir, mode: 0o755})
	}
	if c.Seccomp != "" {
		b, err := os.ReadFile(c.Seccomp)
		if err != nil {
			return nil, fmt.Errorf("read seccomp profile: %w", err)
		}
		if err := validateSeccomp(b); err != nil {
			return nil, fmt.Errorf("seccomp profile %s: %w", c.Seccomp, err)
		}
		// The profile is not read before the daemon's container is
		// created, so its order against the CNI files does not matter.
		files = append(files, file{src: c.Seccomp, dir: c.SeccompDir, mode: 0o644})
	}

	// An older install's conflist goes first: while it stays, every new
	// pod on the node fails.
	if network != nil && c.ConfDir != "" && !c.IntoConfDir {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("remove an older install's conflist: %w", err)
		}
		if err := removeOlder(filepath.Join(c.ConfDir, filepath.Base(c.Conflist)), network.Name, log); err != nil {
			return nil, err
		}
	}
	var done []Installed
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return done, fmt.Errorf("install %s: %w", f.src, err)
		}
		if f.warn {
			log.Warn("installing the conflist into the runtime's configuration folder, as asked", "folder", f.dir, "why_dangerous", whyNotDefault)
		}
		in, err := installFile(f.src, f.dir, f.mode)
		if err != nil {
			return done, err
		}
		log.Info("installed", "source", f.src, "path", in.Path, "bytes", in.Bytes, "sha256", in.SHA256, "changed", in.Changed)
		done = append(done, in)
	}
	if c.ConfDir != "" {
		warnIfDefault(c.ConfDir, log)
	}
	return done, nil
}

// removeOlder removes path, the conflist an older install put into the
// runtime's configuration folder, if it is galactic's network: a regular
// file that parses as a conflist named network whose first plugin is
// galactic-tap. Anything else of that name is someone's and is left, with
// a warning.
func removeOlder(path, network string, log *slog.Logger) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove an older install's conflist: %w", err)
	}
	leave := func(why string) error {
		log.Warn("left a file of galactic's conflist name in the runtime's configuration folder: not galactic's network", "path", path, "why_left", why)
		return nil
	}
	if !st.Mode().IsRegular() {
		return leave("not a regular file: something other than install-cni manages it")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("remove an older install's conflist: %w", err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return leave("does not parse as a conflist: " + err.Error())
	}
	if l.Name != network {
		return leave(fmt.Sprintf("names network %q, not %q", l.Name, network))
	}
	if len(l.Plugins) == 0 || l.Plugins[0].Network.Type != PluginType {
		return leave("its first plugin is not " + PluginType)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove an older install's conflist: %w", err)
	}
	dir := filepath.Dir(path)
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("remove an older install's conflist: %w", err)
	}
	log.Warn("removed the conflist an older install put into the runtime's configuration folder", "path", path, "network", network,
		"why", whyNotDefault)
	return nil
}

// defaultNetwork returns the file of dir a runtime takes as every pod's
// network, as containerd's go-cni picks it: the first .conf, .conflist or
// .json file by name, read as a conflist or as a single network. CRI-O's
// ocicni keeps the same order and skips a file it cannot load. An empty
// path and no error: dir holds no configuration.
func defaultNetwork(dir string) (string, *libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil || len(files) == 0 {
		return "", nil, err
	}
	sort.Strings(files)
	first := files[0]
	if strings.HasSuffix(first, ".conflist") {
		l, err := libcni.ConfListFromFile(first)
		return first, l, err
	}
	conf, err := libcni.ConfFromFile(first) //nolint:staticcheck // single-plugin .conf files are what containerd's go-cni and Multus still read
	if err != nil {
		return first, nil, err
	}
	if conf.Network.Type == "" {
		return first, nil, fmt.Errorf("%s: no network type", first)
	}
	l, err := libcni.ConfListFromConf(conf) //nolint:staticcheck // single-plugin .conf files are what containerd's go-cni and Multus still read
	return first, l, err
}

// warnIfDefault says when galactic's plugin is the runtime's default
// network in dir, whoever put it there: install-cni removes only its own
// file, so a copy under another name needs an operator.
func warnIfDefault(dir string, log *slog.Logger) {
	path, l, err := defaultNetwork(dir)
	if err != nil || l == nil {
		return
	}
	for _, p := range l.Plugins {
		if p.Network.Type == PluginType {
			log.Warn("galactic's plugin is the runtime's default network: it runs for every pod on this node", "path", path, "network", l.Name, "why_dangerous", whyNotDefault)
			return
		}
	}
}

// validateConflist refuses what a runtime could not use: it must parse as a
// conflist, with a name and at least one plugin.
func validateConflist(b []byte) (*libcni.NetworkConfigList, error) {
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return nil, err
	}
	if l.Name == "" {
		return nil, errors.New("no network name")
	}
	if len(l.Plugins) == 0 {
		return nil, errors.New("no plugins")
	}
	return l, nil
}

// validateSeccomp refuses a profile a runtime would reject at container
// creation, long after the install said it was done: it must be a JSON
// object with a default action and named syscall rules.
func validateSeccomp(b []byte) error {
	var p struct {
		DefaultAction string `json:"defaultAction"`
		Syscalls      []struct {
			Names  []string `json:"names"`
			Action string   `json:"action"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	if p.DefaultAction == "" {
		return errors.New("no defaultAction")
	}
	for i, r := range p.Syscalls {
		if len(r.Names) == 0 || r.Action == "" {
			return fmt.Errorf("syscall rule %d names no syscall or action", i)
		}
	}
	return nil
}

func checkPlugin(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("plugin: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() == 0 {
		return fmt.Errorf("plugin %s: not a non-empty regular file", path)
	}
	return nil
}

// installFile puts src into dir under its own name with mode: a temporary
// file in dir, synced, renamed over the target, then dir synced so that
// the rename survives a crash.
func installFile(src, dir string, mode fs.FileMode) (Installed, error) {
	target := filepath.Join(dir, filepath.Base(src))
	// Missing folders are made as kubelet's DirectoryOrCreate would have.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Installed{}, fmt.Errorf("make folder %s: %w", dir, err)
	}
	sum, size, err := fileSHA256(src)
	if err != nil {
		return Installed{}, err
	}
	in := Installed{Path: target, Bytes: size, SHA256: sum}
	if same(target, sum, mode) {
		return in, nil
	}
	// A leftover of an install that died midway is removed, not renamed:
	// it may be partial.
	pattern := "." + filepath.Base(target) + ".tmp-*"
	if old, _ := filepath.Glob(filepath.Join(dir, pattern)); len(old) > 0 {
		for _, o := range old {
			_ = os.Remove(o)
		}
	}
	// The temporary name ends in neither .conflist nor .conf, so a runtime
	// scanning the folder ignores it.
	tmp, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", target, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	if err := copyInto(tmp, src, mode); err != nil {
		tmp.Close()
		return Installed{}, fmt.Errorf("install %s: %w", target, err)
	}
	if err := tmp.Close(); err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", target, err)
	}
	// The source may have changed since it was hashed; the log must name
	// what was installed.
	if got, _, err := fileSHA256(tmp.Name()); err != nil || got != sum {
		return Installed{}, fmt.Errorf("install %s: %s changed while being copied", target, src)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", target, err)
	}
	if err := syncDir(dir); err != nil {
		return Installed{}, fmt.Errorf("install %s: %w", target, err)
	}
	in.Changed = true
	return in, nil
}

func copyInto(dst *os.File, src string, mode fs.FileMode) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.Copy(dst, f); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	// Chmod after writing, not a create mode: the umask would narrow it.
	if err := dst.Chmod(mode); err != nil {
		return err
	}
	return dst.Sync()
}

// same reports whether target already is a regular file with these bytes
// and this mode, so a rerun leaves it, its inode and its times alone.
func same(target, sum string, mode fs.FileMode) bool {
	st, err := os.Lstat(target)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != mode {
		return false
	}
	got, _, err := fileSHA256(target)
	return err == nil && got == sum
}

func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync folder %s: %w", dir, err)
	}
	return nil
}

// checkLayout refuses to replace the installed plugin by one whose maps'
// layout differs from the pinned maps' as their daemon recorded it: every
// ADD of this build would then fail on the node, and a rollout would spread
// that to every node it reached. The old plugin stays, and serves the old
// pins until the node is drained or rolled back. Without a record (pins of
// a daemon older than the record) it installs, and says what follows.
func checkLayout(c Config, log *slog.Logger) error {
	if c.PinDir == "" {
		return nil
	}
	if c.Layout == "" || len(c.PinnedMaps) == 0 {
		return errors.New("checking the pinned maps' layout needs this build's layout and map names")
	}
	pinned := false
	for _, name := range c.PinnedMaps {
		if _, err := os.Stat(filepath.Join(c.PinDir, name)); err == nil {
			pinned = true
			break
		}
	}
	if !pinned {
		log.Info("no datapath map is pinned yet: nothing to check the plugin against", "pins", c.PinDir)
		return nil
	}
	rec, err := os.ReadFile(c.LayoutRecord)
	if errors.Is(err, fs.ErrNotExist) {
		log.Warn("maps are pinned but no daemon recorded their layout (a build older than the record pinned them): installing; "+
			"if the layouts differ, the daemon refuses to start naming the map, ADD fails naming it, DEL still removes taps",
			"pins", c.PinDir, "record", c.LayoutRecord, "layout", c.Layout)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the pinned maps' layout record: %w", err)
	}
	fields := strings.Fields(string(rec))
	switch {
	case len(fields) > 0 && fields[0] == c.Layout:
	case len(fields) > 1 && c.Shape != "" && fields[1] == c.Shape:
		// The daemon gives them this build's capacities at start, and ADD
		// fails naming the map until it has.
		log.Info("the pinned maps differ from this build's in capacity alone: the daemon migrates them at start",
			"pins", c.PinDir, "recorded", fields[0], "layout", c.Layout)
		return nil
	default:
		got := strings.Join(fields, " ")
		return fmt.Errorf("%w: the maps pinned under %s are of layout %q (recorded in %s), this build's are %q. "+
			"The plugin installed before stays and serves them. To upgrade this node, move its workloads away, remove %s, and restart this pod; or roll back",
			ErrLayoutDiffers, c.PinDir, got, c.LayoutRecord, c.Layout, c.PinDir)
	}
	log.Info("the pinned maps are of this build's layout", "pins", c.PinDir, "layout", c.Layout)
	return nil
}
