package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

const testVersion = "imagebuild-test"

// TestMakeImages runs `make images` twice from the current tree into two
// folders and checks what a cluster will run: the same digests, static
// binaries and nothing else, a non-root hub controller, archives that an
// OCI layout reader loads.
func TestMakeImages(t *testing.T) {
	// Two image builds take minutes on loaded cores: make test runs them,
	// make test-unit (-short) stays quick.
	if testing.Short() {
		t.Skip("builds the images twice")
	}
	for _, tool := range []string{"make", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI must build the images: %v", err)
			}
			t.Skipf("%s not installed: %v", tool, err)
		}
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dirs := []string{t.TempDir(), t.TempDir()}
	for _, d := range dirs {
		makeImages(t, root, d)
	}

	for _, name := range []string{"galactic-node", "galactic-hubctl"} {
		t.Run(name, func(t *testing.T) {
			var digests []string
			for _, d := range dirs {
				b, err := os.ReadFile(filepath.Join(d, name+".digest"))
				if err != nil {
					t.Fatal(err)
				}
				digests = append(digests, strings.TrimSpace(string(b)))
			}
			if digests[0] != digests[1] || !strings.HasPrefix(digests[0], "sha256:") {
				t.Fatalf("two builds of one tree gave digests %q and %q", digests[0], digests[1])
			}
			a0, _ := os.ReadFile(filepath.Join(dirs[0], name+".oci.tar"))
			a1, _ := os.ReadFile(filepath.Join(dirs[1], name+".oci.tar"))
			if !bytes.Equal(a0, a1) {
				t.Errorf("two builds of one tree gave different archives")
			}
			t.Logf("%s: %s, archive %d bytes", name, digests[0], len(a0))

			img := loadArchive(t, filepath.Join(dirs[0], name+".oci.tar"), "ghcr.io/datum-cloud/"+name+":"+testVersion, digests[0])
			files := imageFiles(t, img)
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.Config.Labels["org.opencontainers.image.version"] != testVersion ||
				cf.Config.Labels["org.opencontainers.image.source"] == "" ||
				cf.Config.Labels["org.opencontainers.image.revision"] == "" {
				t.Errorf("labels %v lack source, revision or version", cf.Config.Labels)
			}
			// created is the build's fixed time, as the layer's and the
			// config's own, so that it changes no digest between clones.
			if got := cf.Config.Labels["org.opencontainers.image.created"]; got == "" || got != cf.Created.Time.UTC().Format(time.RFC3339) {
				t.Errorf("label created %q, want the image's time %v", got, cf.Created)
			}
			if got := cf.Config.Labels["org.opencontainers.image.title"]; got != name {
				t.Errorf("label title %q, want %s", got, name)
			}
			wantEntry := "/usr/local/bin/" + name
			if !slices.Equal(cf.Config.Entrypoint, []string{wantEntry}) {
				t.Errorf("entrypoint %q, want %q", cf.Config.Entrypoint, wantEntry)
			}
			// Each image carries the license and its SBOM (docs/release.md).
			want := []string{"usr/local/bin/" + name, "usr/share/doc/galactic/LICENSE", "usr/share/sbom/" + name + ".cdx.json"}
			if name == "galactic-node" {
				want = append(want, "etc/galactic/seccomp/galactic-node.json", "usr/local/bin/galactic-tap")
				if cf.Config.User != "" && cf.Config.User != "0" && cf.Config.User != "0:0" {
					t.Errorf("node image user %q: the daemon needs root", cf.Config.User)
				}
			} else if cf.Config.User != "65532:65532" {
				t.Errorf("hubctl image user %q, want 65532:65532", cf.Config.User)
			}
			var got []string
			for n := range files {
				got = append(got, n)
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("image files %q, want exactly %q", got, want)
			}
			if _, ok := files["bin/sh"]; ok {
				t.Error("image holds /bin/sh")
			}
			for n, data := range files {
				if strings.HasPrefix(n, "usr/local/bin/") {
					checkStatic(t, n, data)
				}
			}
			// The binary in the image is the version the build was asked for.
			bin := filepath.Join(t.TempDir(), name)
			if err := os.WriteFile(bin, files["usr/local/bin/"+name], 0o755); err != nil {
				t.Fatal(err)
			}
			args := []string{"version"}
			if name == "galactic-hubctl" {
				args = []string{"--version"}
			}
			out, err := exec.CommandContext(t.Context(), bin, args...).Output()
			if err != nil || strings.TrimSpace(string(out)) != testVersion {
				t.Errorf("%s %s: %q, %v; want %s", name, args[0], out, err, testVersion)
			}
		})
	}
}

func makeImages(t *testing.T, root, dir string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "make", "-C", root, "--no-print-directory", "images",
		"IMAGE_DIR="+dir, "IMAGE_VERSION="+testVersion)
	// A make running this test must not lend its flags or jobserver to
	// this one.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == "MAKEFLAGS" || k == "MFLAGS" || k == "MAKELEVEL"
	})
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make images: %v\n%s", err, out)
	}
}

// loadArchive unpacks an OCI archive and reads it with go-containerregistry's
// layout reader, which is what podman's and containerd's loaders expect.
func loadArchive(t *testing.T, archive, ref, digest string) v1.Image {
	t.Helper()
	dir := t.TempDir()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var names []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("archive entry %s owned by %d:%d", h.Name, h.Uid, h.Gid)
		}
		names = append(names, h.Name)
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, 0o644)
			}
		default:
			t.Fatalf("archive entry %s of type %c", h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !slices.IsSorted(names) {
		t.Errorf("archive entries not in order: %q", names)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index lists %d manifests, want 1", len(im.Manifests))
	}
	m := im.Manifests[0]
	if got := m.Annotations[refNameAnnotation]; got != ref {
		t.Errorf("index names the image %q, want %q", got, ref)
	}
	if m.Digest.String() != digest {
		t.Errorf("index lists %s, the digest file says %s", m.Digest, digest)
	}
	img, err := idx.Image(m.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Errorf("image does not validate: %v", err)
	}
	return img
}

// imageFiles returns the regular files of the image's filesystem, checking
// that every entry is root's and dated the same.
func imageFiles(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string][]byte{}
	var first *tar.Header
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if first == nil {
			first = h
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(first.ModTime) {
			t.Errorf("layer entry %s: owner %d:%d, time %v", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if h.Mode != 0o755 {
				t.Errorf("folder %s mode %o", h.Name, h.Mode)
			}
		case tar.TypeReg:
			// Programs run; data (the seccomp profile) is only read.
			want := int64(0o644)
			if strings.HasPrefix(h.Name, "usr/local/bin/") {
				want = 0o755
			}
			if h.Mode != want {
				t.Errorf("file %s mode %o, want %o", h.Name, h.Mode, want)
			}
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[strings.TrimPrefix(h.Name, "/")] = b
		default:
			t.Errorf("layer entry %s of type %c", h.Name, h.Typeflag)
		}
	}
	return files
}

// checkStatic fails unless data is an ELF executable with no interpreter
// and no shared libraries: on an empty base there is no ld.so to run.
func checkStatic(t *testing.T, name string, data []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Errorf("%s is not ELF: %v", name, err)
		return
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has an interpreter (PT_INTERP): it is not static", name)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs shared libraries %q", name, libs)
	}
}

func TestFlagsRefuseAnUnreproducibleBuild(t *testing.T) {
	base := []string{"-ref", "x/y:z", "-add", "a=/usr/local/bin/a", "-entrypoint", "/usr/local/bin/a", "-out", "o.tar"}
	noEnv := func(string) string { return "" }
	for name, c := range map[string]struct {
		args   []string
		getenv func(string) string
		want   string
	}{
		"no epoch":           {base, noEnv, "SOURCE_DATE_EPOCH"},
		"bad epoch":          {append(slices.Clone(base), "-epoch", "yesterday"), noEnv, "whole seconds"},
		"relative dst":       {[]string{"-ref", "x", "-add", "a=usr/a", "-entrypoint", "usr/a", "-out", "o", "-epoch", "1"}, noEnv, "absolute"},
		"entrypoint missing": {[]string{"-ref", "x", "-add", "a=/a", "-entrypoint", "/b", "-out", "o", "-epoch", "1"}, noEnv, "none of the -add"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseFlags(c.args, c.getenv)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
	s, err := parseFlags(base, func(k string) string {
		if k == "SOURCE_DATE_EPOCH" {
			return "1700000000"
		}
		return ""
	})
	if err != nil || s.epoch.Unix() != 1700000000 {
		t.Errorf("SOURCE_DATE_EPOCH not taken: %+v, %v", s, err)
	}
}
