package cniinstall

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const goodConflist = `{"cniVersion": "1.1.0", "name": "galactic", "plugins": [{"type": "galactic-tap"}]}`

type env struct {
	cfg             Config
	plugin, conf    string // the installed paths: the plugin, and the conflist in Multus' folder
	srcDir, hostDir string
}

func newEnv(t *testing.T, plugin []byte, conflist string) env {
	t.Helper()
	src := t.TempDir()
	host := t.TempDir()
	e := env{
		cfg: Config{
			Plugin:        filepath.Join(src, "galactic-tap"),
			Conflist:      filepath.Join(src, "10-galactic.conflist"),
			BinDir:        filepath.Join(host, "opt/cni/bin"),
			ConfDir:       filepath.Join(host, "etc/cni/net.d"),
			MultusConfDir: filepath.Join(host, "etc/cni/multus/net.d"),
		},
		srcDir:  src,
		hostDir: host,
	}
	e.plugin = filepath.Join(e.cfg.BinDir, "galactic-tap")
	e.conf = filepath.Join(e.cfg.MultusConfDir, "10-galactic.conflist")
	write(t, e.cfg.Plugin, plugin, 0o700)
	write(t, e.cfg.Conflist, []byte(conflist), 0o600)
	return e
}

func write(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func TestInstallThenRerunChangesNothing(t *testing.T) {
	plugin := []byte("\x7fELF plugin bytes")
	e := newEnv(t, plugin, goodConflist)
	var logs bytes.Buffer
	got, err := Install(context.Background(), e.cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[0].Changed || !got[1].Changed || got[0].Path != e.plugin || got[1].Path != e.conf {
		t.Fatalf("first install reported %+v", got)
	}
	if got[0].Bytes != int64(len(plugin)) || len(got[0].SHA256) != 64 {
		t.Errorf("plugin reported as %+v", got[0])
	}
	for _, want := range []string{"path=" + e.plugin, "path=" + e.conf, "sha256=" + got[0].SHA256, "bytes=" + "17"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	checkFile(t, e.plugin, plugin, 0o755)
	checkFile(t, e.conf, []byte(goodConflist), 0o644)
	for _, d := range []string{e.cfg.BinDir, e.cfg.MultusConfDir} {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm() != 0o755 {
			t.Errorf("made folder %s: %v, %v", d, st.Mode(), err)
		}
	}

	before := inodes(t, e.plugin, e.conf)
	got, err = Install(context.Background(), e.cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Changed || got[1].Changed {
		t.Errorf("second install changed something: %+v", got)
	}
	checkFile(t, e.plugin, plugin, 0o755)
	checkFile(t, e.conf, []byte(goodConflist), 0o644)
	if after := inodes(t, e.plugin, e.conf); after != before {
		t.Errorf("second install replaced files: inodes %v, then %v", before, after)
	}
	onlyTargets(t, e)
}

func TestNewBytesOrModeReplace(t *testing.T) {
	e := newEnv(t, []byte("v1"), goodConflist)
	if _, err := Install(context.Background(), e.cfg, quiet()); err != nil {
		t.Fatal(err)
	}
	write(t, e.cfg.Plugin, []byte("v2"), 0o700)
	if err := os.Chmod(e.conf, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Install(context.Background(), e.cfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	if !got[0].Changed || !got[1].Changed {
		t.Errorf("new plugin bytes and a wrong conflist mode must both be replaced: %+v", got)
	}
	checkFile(t, e.plugin, []byte("v2"), 0o755)
	checkFile(t, e.conf, []byte(goodConflist), 0o644)
}

func TestBadSourcesChangeNothing(t *testing.T) {
	for name, c := range map[string]struct {
		conflist     string
		removePlugin bool
		want         string
	}{
		"not json":       {conflist: `{"name": "galactic", "plugins": [`, want: "conflist"},
		"no name":        {conflist: `{"cniVersion": "1.1.0", "plugins": [{"type": "galactic-tap"}]}`, want: "no name"},
		"empty name":     {conflist: `{"cniVersion": "1.1.0", "name": "", "plugins": [{"type": "galactic-tap"}]}`, want: "no network name"},
		"no plugins":     {conflist: `{"cniVersion": "1.1.0", "name": "galactic"}`, want: "plugins"},
		"empty plugins":  {conflist: `{"cniVersion": "1.1.0", "name": "galactic", "plugins": []}`, want: "plugins"},
		"a single conf":  {conflist: `{"cniVersion": "1.1.0", "name": "galactic", "type": "galactic-tap"}`, want: "plugins"},
		"missing plugin": {conflist: goodConflist, removePlugin: true, want: "no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			// Installed once from good sources, then the sources go bad.
			e := newEnv(t, []byte("old plugin"), goodConflist)
			if _, err := Install(context.Background(), e.cfg, quiet()); err != nil {
				t.Fatal(err)
			}
			before := inodes(t, e.plugin, e.conf)
			write(t, e.cfg.Plugin, []byte("new plugin"), 0o700)
			write(t, e.cfg.Conflist, []byte(c.conflist), 0o600)
			if c.removePlugin {
				if err := os.Remove(e.cfg.Plugin); err != nil {
					t.Fatal(err)
				}
			}
			_, err := Install(context.Background(), e.cfg, quiet())
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got error %v, want one saying %q", err, c.want)
			}
			checkFile(t, e.plugin, []byte("old plugin"), 0o755)
			checkFile(t, e.conf, []byte(goodConflist), 0o644)
			if after := inodes(t, e.plugin, e.conf); after != before {
				t.Errorf("a refused install replaced files")
			}
			onlyTargets(t, e)
		})
	}
}

func TestBadConflistMakesNoFolders(t *testing.T) {
	e := newEnv(t, []byte("plugin"), `{"plugins": []}`)
	if _, err := Install(context.Background(), e.cfg, quiet()); err == nil {
		t.Fatal("a conflist without a name was installed")
	}
	if ents, _ := os.ReadDir(e.hostDir); len(ents) != 0 {
		t.Errorf("a refused install made %v", ents)
	}
}

func TestLeftoverTemporaryFilesAreRemoved(t *testing.T) {
	e := newEnv(t, []byte("plugin"), goodConflist)
	if err := os.MkdirAll(e.cfg.BinDir, 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(e.cfg.BinDir, ".galactic-tap.tmp-123"), []byte("half a plug"), 0o600)
	if _, err := Install(context.Background(), e.cfg, quiet()); err != nil {
		t.Fatal(err)
	}
	onlyTargets(t, e)
}

// A reader polling the final names while installs alternate between two
// plugins and two conflists must only ever see one whole file or the other.
func TestNoPartialFileUnderTheFinalName(t *testing.T) {
	pluginA := bytes.Repeat([]byte("A"), 1<<20)
	pluginB := bytes.Repeat([]byte("B"), 1<<20)
	confB := `{"cniVersion": "1.1.0", "name": "galactic", "plugins": [{"type": "galactic-tap", "table": 1001}]}`
	e := newEnv(t, pluginA, goodConflist)
	if _, err := Install(context.Background(), e.cfg, quiet()); err != nil {
		t.Fatal(err)
	}
	// The installer reads its sources from a second folder per variant, so
	// the sources themselves are never rewritten while being copied.
	variants := []Config{e.cfg, e.cfg}
	dirB := t.TempDir()
	variants[1].Plugin = filepath.Join(dirB, "galactic-tap")
	variants[1].Conflist = filepath.Join(dirB, "10-galactic.conflist")
	write(t, variants[1].Plugin, pluginB, 0o755)
	write(t, variants[1].Conflist, []byte(confB), 0o644)

	stop := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		defer close(errc)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := Install(context.Background(), variants[i%2], quiet()); err != nil {
				errc <- err
				return
			}
		}
	}()
	deadline := time.Now().Add(2 * time.Second)
	reads := 0
	for time.Now().Before(deadline) {
		p, err := os.ReadFile(e.plugin)
		if err != nil {
			t.Fatalf("plugin missing during an install: %v", err)
		}
		if !bytes.Equal(p, pluginA) && !bytes.Equal(p, pluginB) {
			t.Fatalf("read a partial plugin of %d bytes", len(p))
		}
		c, err := os.ReadFile(e.conf)
		if err != nil {
			t.Fatalf("conflist missing during an install: %v", err)
		}
		if string(c) != goodConflist && string(c) != confB {
			t.Fatalf("read a partial conflist %q", c)
		}
		reads++
	}
	close(stop)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d whole reads", reads)
	onlyTargets(t, e)
}

func TestCancelledContextInstallsNothing(t *testing.T) {
	e := newEnv(t, []byte("plugin"), goodConflist)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Install(ctx, e.cfg, quiet()); err == nil {
		t.Fatal("installed with a cancelled context")
	}
	if _, err := os.Stat(e.plugin); !os.IsNotExist(err) {
		t.Errorf("plugin installed with a cancelled context: %v", err)
	}
}

func checkFile(t *testing.T, path string, want []byte, mode os.FileMode) {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode() != mode {
		t.Errorf("%s: mode %v, want %v", path, st.Mode(), mode)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s holds %q, want %q", path, trim(got), trim(want))
	}
}

func trim(b []byte) []byte {
	if len(b) > 40 {
		return b[:40]
	}
	return b
}

func inodes(t *testing.T, paths ...string) [2]uint64 {
	t.Helper()
	var out [2]uint64
	for i, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = st.Sys().(*syscall.Stat_t).Ino
	}
	return out
}

// onlyTargets fails if an install left anything beside its targets, or
// touched the runtime's configuration folder.
func onlyTargets(t *testing.T, e env) {
	t.Helper()
	if _, err := os.Stat(e.cfg.ConfDir); !os.IsNotExist(err) {
		t.Errorf("the runtime's configuration folder was made: %v", err)
	}
	for dir, name := range map[string]string{e.cfg.BinDir: "galactic-tap", e.cfg.MultusConfDir: "10-galactic.conflist"} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 1 || ents[0].Name() != name {
			var names []string
			for _, en := range ents {
				names = append(names, en.Name())
			}
			t.Errorf("%s holds %v, want only %s", dir, names, name)
		}
	}
}

// A ConfigMap volume presents its files as symlinks into a ..data folder:
// the file is installed under the link's name, with the link's target's
// bytes.
func TestConfigMapSymlinkSource(t *testing.T) {
	e := newEnv(t, []byte("plugin"), goodConflist)
	data := filepath.Join(e.srcDir, "..data")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(e.cfg.Conflist, filepath.Join(data, "10-galactic.conflist")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/10-galactic.conflist", e.cfg.Conflist); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(context.Background(), e.cfg, quiet()); err != nil {
		t.Fatal(err)
	}
	checkFile(t, e.conf, []byte(goodConflist), 0o644)
}
