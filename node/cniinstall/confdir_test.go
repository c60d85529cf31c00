package cniinstall

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// kindnet is a primary network whose file sorts after galactic's.
const kindnet = `{"cniVersion": "0.3.1", "name": "kindnet", "plugins": [{"type": "ptp", "ipMasq": false}, {"type": "portmap", "capabilities": {"portMappings": true}}]}`

// olderConflist is the conflist deploy/ shipped, and install-cni put into
// the runtime's configuration folder, before the plugin alone was the
// default: deploy/node/10-galactic.conflist up to 9d7a55f, byte for byte.
var olderConflist = mustReadFile("testdata/older-10-galactic.conflist")

func mustReadFile(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// plainEnv is an env with the default install's configuration: no Multus
// folder, nothing asked of the runtime's folder.
func plainEnv(t *testing.T) env {
	t.Helper()
	e := newEnv(t, []byte("plugin"), goodConflist)
	e.cfg.MultusConfDir = ""
	return e
}

func logTo(b *bytes.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// folder returns name -> content of every entry of dir.
func folder(t *testing.T, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, en := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, en.Name()))
		out[en.Name()] = string(b)
	}
	return out
}

func names(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestTheDefaultInstallWritesNoConflist(t *testing.T) {
	for _, seeded := range []bool{false, true} {
		e := plainEnv(t)
		if seeded {
			write(t, filepath.Join(e.cfg.ConfDir, "10-kindnet.conflist"), []byte(kindnet), 0o644)
		}
		before := folder(t, e.cfg.ConfDir)
		for range 2 {
			var logs bytes.Buffer
			got, err := Install(context.Background(), e.cfg, logTo(&logs))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Path != e.plugin {
				t.Fatalf("installed %+v, want the plugin alone", got)
			}
			if strings.Contains(logs.String(), "level=WARN") {
				t.Errorf("warned on a clean folder:\n%s", logs.String())
			}
		}
		checkFile(t, e.plugin, []byte("plugin"), 0o755)
		after := folder(t, e.cfg.ConfDir)
		if len(after) != len(before) || after["10-kindnet.conflist"] != before["10-kindnet.conflist"] {
			t.Errorf("the runtime's configuration folder went from %v to %v", names(before), names(after))
		}
		if !seeded && after != nil {
			t.Errorf("the runtime's configuration folder was made: %v", names(after))
		}
	}
}

func TestAnOlderInstallsConflistIsRemoved(t *testing.T) {
	e := plainEnv(t)
	write(t, e.cfg.Conflist, []byte(olderConflist), 0o644)
	old := filepath.Join(e.cfg.ConfDir, "10-galactic.conflist")
	write(t, old, []byte(olderConflist), 0o644)
	write(t, filepath.Join(e.cfg.ConfDir, "10-kindnet.conflist"), []byte(kindnet), 0o644)
	var logs bytes.Buffer
	if _, err := Install(context.Background(), e.cfg, logTo(&logs)); err != nil {
		t.Fatal(err)
	}
	if got := names(folder(t, e.cfg.ConfDir)); len(got) != 1 || got[0] != "10-kindnet.conflist" {
		t.Fatalf("the runtime's configuration folder holds %v, want kindnet's alone", got)
	}
	for _, want := range []string{"level=WARN", "removed the conflist an older install put", "path=" + old, "every pod"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	// A rerun finds nothing to do.
	logs.Reset()
	if _, err := Install(context.Background(), e.cfg, logTo(&logs)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("the rerun warned:\n%s", logs.String())
	}
}

// A file of the conflist's name that is not galactic's network is someone
// else's: it is left, and the log says so.
func TestOnlyGalacticsOwnConflistIsRemoved(t *testing.T) {
	for name, c := range map[string]struct {
		content string
		link    bool // a symlink to a galactic conflist
		dir     bool
		want    string
	}{
		"another network":      {content: strings.Replace(olderConflist, `"galactic"`, `"tenant-net"`, 1), want: `names network \"tenant-net\"`},
		"another plugin first": {content: `{"cniVersion": "1.1.0", "name": "galactic", "plugins": [{"type": "bridge"}, {"type": "galactic-tap"}]}`, want: "first plugin is not galactic-tap"},
		"not a conflist":       {content: `{"name": "galactic", "type": "galactic-tap"`, want: "does not parse"},
		"a symlink":            {link: true, want: "not a regular file"},
		"a folder":             {dir: true, want: "not a regular file"},
	} {
		t.Run(name, func(t *testing.T) {
			e := plainEnv(t)
			write(t, e.cfg.Conflist, []byte(olderConflist), 0o644)
			path := filepath.Join(e.cfg.ConfDir, "10-galactic.conflist")
			if err := os.MkdirAll(e.cfg.ConfDir, 0o755); err != nil {
				t.Fatal(err)
			}
			switch {
			case c.link:
				target := filepath.Join(t.TempDir(), "galactic.conflist")
				write(t, target, []byte(olderConflist), 0o644)
				if err := os.Symlink(target, path); err != nil {
					t.Fatal(err)
				}
			case c.dir:
				if err := os.Mkdir(path, 0o755); err != nil {
					t.Fatal(err)
				}
			default:
				write(t, path, []byte(c.content), 0o644)
			}
			before := folder(t, e.cfg.ConfDir)
			var logs bytes.Buffer
			if _, err := Install(context.Background(), e.cfg, logTo(&logs)); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Lstat(path); err != nil {
				t.Fatalf("removed a file that is not galactic's network: %v", err)
			}
			if after := folder(t, e.cfg.ConfDir); after["10-galactic.conflist"] != before["10-galactic.conflist"] {
				t.Errorf("changed a file that is not galactic's network")
			}
			for _, want := range []string{"level=WARN", "left a file of galactic's conflist name", c.want} {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, logs.String())
				}
			}
		})
	}
}

// galactic's plugin as the default network under a name install-cni never
// used is left to an operator, and the log says what it does.
func TestGalacticAsTheDefaultNetworkIsWarnedOf(t *testing.T) {
	e := plainEnv(t)
	copied := filepath.Join(e.cfg.ConfDir, "00-galactic-copy.conflist")
	write(t, copied, []byte(olderConflist), 0o644)
	write(t, filepath.Join(e.cfg.ConfDir, "10-kindnet.conflist"), []byte(kindnet), 0o644)
	var logs bytes.Buffer
	if _, err := Install(context.Background(), e.cfg, logTo(&logs)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(copied); err != nil {
		t.Fatalf("removed a file install-cni never wrote: %v", err)
	}
	for _, want := range []string{"level=WARN", "galactic's plugin is the runtime's default network", "path=" + copied} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

func TestTheConflistGoesIntoTheRuntimesFolderOnlyWhenAskedAndWithAWarning(t *testing.T) {
	e := plainEnv(t)
	e.cfg.IntoConfDir = true
	var logs bytes.Buffer
	got, err := Install(context.Background(), e.cfg, logTo(&logs))
	if err != nil {
		t.Fatal(err)
	}
	into := filepath.Join(e.cfg.ConfDir, "10-galactic.conflist")
	if len(got) != 2 || got[1].Path != into || !got[1].Changed {
		t.Fatalf("installed %+v, want the plugin and the conflist in the runtime's folder", got)
	}
	checkFile(t, into, []byte(goodConflist), 0o644)
	for _, want := range []string{"level=WARN", "installing the conflist into the runtime's configuration folder, as asked",
		"why_dangerous=", "every pod", "galactic's plugin is the runtime's default network"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	// Asked again, it changes nothing and still warns.
	logs.Reset()
	got, err = Install(context.Background(), e.cfg, logTo(&logs))
	if err != nil || got[1].Changed {
		t.Fatalf("rerun: %+v %v", got, err)
	}
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("the rerun did not warn:\n%s", logs.String())
	}
}

func TestConfigurationsThatCannotBeMeantAreRefused(t *testing.T) {
	for name, c := range map[string]struct {
		set  func(e *env)
		want string
	}{
		"Multus' folder is the runtime's": {func(e *env) { e.cfg.MultusConfDir = e.cfg.ConfDir + "/" }, "is the runtime's configuration folder"},
		"Multus' folder links to the runtime's": {func(e *env) {
			if err := os.MkdirAll(e.cfg.ConfDir, 0o755); err != nil {
				t.Fatal(err)
			}
			e.cfg.MultusConfDir = filepath.Join(e.hostDir, "multus-link")
			if err := os.Symlink(e.cfg.ConfDir, e.cfg.MultusConfDir); err != nil {
				t.Fatal(err)
			}
		}, "is the runtime's configuration folder"},
		"into the runtime's folder with none":    {func(e *env) { e.cfg.IntoConfDir, e.cfg.ConfDir = true, "" }, "needs that folder"},
		"into the runtime's folder, no source":   {func(e *env) { e.cfg.IntoConfDir, e.cfg.Conflist = true, "" }, "needs a conflist"},
		"into Multus' folder, no source":         {func(e *env) { e.cfg.Conflist = "" }, "needs a conflist"},
		"no plugin":                              {func(e *env) { e.cfg.Plugin = "" }, "plugin"},
		"no plugin folder":                       {func(e *env) { e.cfg.BinDir = "" }, "plugin folder"},
		"a seccomp profile without its folder":   {func(e *env) { e.cfg.Seccomp = e.cfg.Plugin }, "seccomp"},
		"the CLI without its folder":             {func(e *env) { e.cfg.CLI = e.cfg.Plugin }, "CLI"},
		"an unreadable source, an older install": {func(e *env) { e.cfg.Conflist = filepath.Join(e.srcDir, "missing.conflist") }, "read conflist"},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, []byte("plugin"), goodConflist)
			old := filepath.Join(e.cfg.ConfDir, "10-galactic.conflist")
			write(t, old, []byte(olderConflist), 0o644) // bad input must not remove it either
			c.set(&e)
			_, err := Install(context.Background(), e.cfg, quiet())
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
			if got := folder(t, filepath.Join(e.hostDir, "opt")); got != nil {
				t.Errorf("a refused install made %v", got)
			}
			checkFile(t, old, []byte(olderConflist), 0o644)
		})
	}
}
