package integration

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// releaseVersion is the tag the test gives HEAD in its clones.
const releaseVersion = "v0.0.0-releasetest"

// releaseImages are the release's images and the binaries each holds.
var releaseImages = map[string][]string{
	"galactic-node":   {"/usr/local/bin/galactic-node", "/usr/local/bin/galactic-tap"},
	"galactic-hubctl": {"/usr/local/bin/galactic-hubctl"},
}

// TestTheReleaseIsReproducibleAndDescribesItself runs `make release` in two
// clones of HEAD, the second with a build cache of its own so that nothing
// it ships comes from the first's, and holds what docs/release.md promises
// of dist/: the same bytes from both; SHA256SUMS true of every file; the
// manifests naming exactly the digests of the archives beside them; each
// image labelled with the version, the tagged revision, the source and the
// license, and carrying the license and its SBOM; each SBOM listing every
// module `go version -m` reports for the binaries the image ships.
func TestTheReleaseIsReproducibleAndDescribesItself(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the release twice, from nothing the second time")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, which make release runs: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	var dists []string
	var head string
	for i, cache := range []string{"", t.TempDir()} {
		clone := filepath.Join(t.TempDir(), "galactic-node")
		run(t, root, "git", "clone", "-q", root, clone)
		run(t, clone, "git", "tag", releaseVersion)
		head = strings.TrimSpace(run(t, clone, "git", "rev-parse", "HEAD"))
		cmd := exec.Command("make", "--no-print-directory", "release", "VERSION="+releaseVersion, "GO="+goBin)
		cmd.Dir = clone
		cmd.Env = os.Environ()
		if cache != "" {
			cmd.Env = append(cmd.Env, "GOCACHE="+cache)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make release in clone %d: %v\n%s", i+1, err, out)
		}
		dists = append(dists, filepath.Join(clone, "dist"))
	}

	files := sameFiles(t, dists[0], dists[1])
	dist := dists[0]
	want := []string{"SHA256SUMS", "galactic-dry-run.yaml", "galactic.yaml"}
	for img := range releaseImages {
		want = append(want, img+"_"+releaseVersion+".cdx.json", img+"_"+releaseVersion+".oci.tar")
	}
	slices.Sort(want)
	if !slices.Equal(files, want) {
		t.Fatalf("dist/ holds %v, want %v", files, want)
	}
	checkSums(t, dist)

	digests := map[string]string{}
	for img, bins := range releaseImages {
		a := readArchive(t, filepath.Join(dist, img+"_"+releaseVersion+".oci.tar"))
		digests[img] = a.digest
		if wantRef := "ghcr.io/datum-cloud/" + img + ":" + releaseVersion; a.ref != wantRef {
			t.Errorf("%s is tagged %q, want %q", img, a.ref, wantRef)
		}
		for k, v := range map[string]string{
			"org.opencontainers.image.version":  releaseVersion,
			"org.opencontainers.image.revision": head,
			"org.opencontainers.image.source":   "https://github.com/datum-cloud/galactic-node",
			"org.opencontainers.image.licenses": "Apache-2.0",
		} {
			if a.labels[k] != v {
				t.Errorf("%s: label %s is %q, want %q", img, k, a.labels[k], v)
			}
		}
		license, err := os.ReadFile(filepath.Join(root, "LICENSE"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.files["/usr/share/doc/galactic/LICENSE"], license) {
			t.Errorf("%s does not carry LICENSE at /usr/share/doc/galactic/LICENSE", img)
		}
		sbom, err := os.ReadFile(filepath.Join(dist, img+"_"+releaseVersion+".cdx.json"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a.files["/usr/share/sbom/"+img+".cdx.json"], sbom) {
			t.Errorf("%s carries another SBOM at /usr/share/sbom/%s.cdx.json than the one published beside it", img, img)
		}
		checkSBOM(t, img, sbom, a, bins)
	}

	for _, manifest := range []string{"galactic.yaml", "galactic-dry-run.yaml"} {
		b, err := os.ReadFile(filepath.Join(dist, manifest))
		if err != nil {
			t.Fatal(err)
		}
		refs := map[string]bool{}
		for _, m := range regexp.MustCompile(`(?m)^\s*image:\s*(\S+)\s*$`).FindAllSubmatch(b, -1) {
			refs[string(m[1])] = true
		}
		wantRefs := map[string]bool{}
		for img, d := range digests {
			wantRefs["ghcr.io/datum-cloud/"+img+"@"+d] = true
		}
		if fmt.Sprint(refs) != fmt.Sprint(wantRefs) {
			t.Errorf("%s runs the images %v; want exactly the archives' %v", manifest, keys(refs), keys(wantRefs))
		}
	}
}

// TestReleaseRefusesWhatIsNotATaggedCleanTree: a release is only ever a
// tag's, built from exactly the tagged tree, and a refusal writes nothing.
func TestReleaseRefusesWhatIsNotATaggedCleanTree(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	clone := filepath.Join(t.TempDir(), "galactic-node")
	run(t, root, "git", "clone", "-q", root, clone)
	release := func(args ...string) string {
		cmd := exec.Command("make", append([]string{"--no-print-directory", "release"}, args...)...)
		cmd.Dir = clone
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("make release %v succeeded:\n%s", args, out)
		}
		if _, err := os.Stat(filepath.Join(clone, "dist")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("make release %v refused, yet wrote dist/ (%v)", args, err)
		}
		return string(out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "say which: make release VERSION=vX.Y.Z"},
		{[]string{"VERSION=1.2.3"}, "want a semantic version tag"},
		{[]string{"VERSION=v1.2.3"}, "HEAD is not tagged v1.2.3"},
	} {
		if out := release(c.args...); !strings.Contains(out, c.want) {
			t.Errorf("make release %v said %q; want it to say %q", c.args, out, c.want)
		}
	}
	run(t, clone, "git", "tag", "v1.2.3")
	if err := os.WriteFile(filepath.Join(clone, "README.md"), []byte("changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out := release("VERSION=v1.2.3"); !strings.Contains(out, "the tree has changes") {
		t.Errorf("make release from a changed tree said %q; want it refused as not clean", out)
	}
}

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}

// sameFiles fails unless a and b hold the same files with the same bytes,
// and returns their names.
func sameFiles(t *testing.T, a, b string) []string {
	t.Helper()
	names := func(dir string) []string {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range entries {
			out = append(out, e.Name())
		}
		return out
	}
	na, nb := names(a), names(b)
	if !slices.Equal(na, nb) {
		t.Fatalf("the two releases hold other files: %v and %v", na, nb)
	}
	for _, n := range na {
		if ha, hb := fileSum(t, filepath.Join(a, n)), fileSum(t, filepath.Join(b, n)); ha != hb {
			t.Errorf("%s differs between the two releases: sha256 %s and %s", n, ha, hb)
		}
	}
	return na
}

func fileSum(t *testing.T, name string) string {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// checkSums holds SHA256SUMS to every other file in dist, as `sha256sum -c`
// would.
func checkSums(t *testing.T, dist string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		sum, name, ok := strings.Cut(strings.TrimSpace(line), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q is not sha256sum's", line)
		}
		listed[name] = true
		if got := fileSum(t, filepath.Join(dist, name)); got != sum {
			t.Errorf("SHA256SUMS says %s is %s; it is %s", name, sum, got)
		}
	}
	entries, _ := os.ReadDir(dist)
	for _, e := range entries {
		if e.Name() != "SHA256SUMS" && !listed[e.Name()] {
			t.Errorf("SHA256SUMS does not list %s", e.Name())
		}
	}
}

// archive is what the test reads of an OCI archive.
type archive struct {
	ref, digest string
	labels      map[string]string
	files       map[string][]byte // the image's files by absolute path
}

func readArchive(t *testing.T, name string) archive {
	t.Helper()
	dir := t.TempDir()
	run(t, dir, "tar", "-xf", name)
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 {
		t.Fatalf("%s: want one image in the index: %v", name, err)
	}
	desc := im.Manifests[0]
	img, err := idx.Image(desc.Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	a := archive{ref: desc.Annotations["org.opencontainers.image.ref.name"], digest: desc.Digest.String(), labels: cfg.Config.Labels, files: map[string][]byte{}}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if h.Typeflag == tar.TypeReg {
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				a.files[path.Join("/", h.Name)] = b
			}
		}
		rc.Close()
	}
	return a
}

// checkSBOM holds an image's SBOM to `go version -m` of each binary the
// image ships: every module it reports (the replacement, where one is
// named) is a component at that version, the toolchain too, and the binary
// is listed with its SHA-256.
func checkSBOM(t *testing.T, img string, sbom []byte, a archive, bins []string) {
	t.Helper()
	var doc struct {
		BOMFormat   string `json:"bomFormat"`
		SpecVersion string `json:"specVersion"`
		Metadata    struct {
			Component struct{ Name, Version string }
		}
		Components []struct {
			Name, Version string
			Hashes        []struct{ Alg, Content string }
		}
	}
	if err := json.Unmarshal(sbom, &doc); err != nil {
		t.Fatalf("%s SBOM: %v", img, err)
	}
	if doc.BOMFormat != "CycloneDX" || doc.SpecVersion == "" || doc.Metadata.Component.Version != releaseVersion {
		t.Errorf("%s SBOM: format %q %q, describing %q %q; want CycloneDX of the release", img, doc.BOMFormat, doc.SpecVersion, doc.Metadata.Component.Name, doc.Metadata.Component.Version)
	}
	listed := map[string]bool{}
	hashes := map[string]string{}
	for _, c := range doc.Components {
		listed[c.Name+"@"+c.Version] = true
		for _, h := range c.Hashes {
			if h.Alg == "SHA-256" {
				hashes[c.Name] = h.Content
			}
		}
	}
	dir := t.TempDir()
	for _, bin := range bins {
		b, ok := a.files[bin]
		if !ok {
			t.Fatalf("%s holds no %s", img, bin)
		}
		sum := sha256.Sum256(b)
		if got := hashes[path.Base(bin)]; got != hex.EncodeToString(sum[:]) {
			t.Errorf("%s SBOM: %s has SHA-256 %q, the shipped binary %x", img, path.Base(bin), got, sum)
		}
		local := filepath.Join(dir, path.Base(bin))
		if err := os.WriteFile(local, b, 0o755); err != nil {
			t.Fatal(err)
		}
		modules := goVersionM(t, local)
		if len(modules) < 3 {
			t.Fatalf("go version -m %s reports %d modules: %v", bin, len(modules), modules)
		}
		for _, m := range modules {
			if !listed[m] {
				t.Errorf("%s SBOM does not list %s, which go version -m reports for %s", img, m, bin)
			}
		}
	}
}

// goVersionM runs `go version -m` on a binary and returns what it built
// with, as "path@version": the toolchain (stdlib@goX.Y.Z) and each
// dependency, or the module that replaced it.
func goVersionM(t *testing.T, bin string) []string {
	t.Helper()
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatalf("go version -m %s: %v", bin, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	var mods []string
	first := true
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case first:
			first = false
			if len(f) == 2 {
				mods = append(mods, "stdlib@"+f[1])
			}
		case len(f) >= 3 && f[0] == "dep":
			mods = append(mods, f[1]+"@"+f[2])
		case len(f) >= 3 && f[0] == "=>":
			mods[len(mods)-1] = f[1] + "@" + f[2]
		}
	}
	return mods
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
