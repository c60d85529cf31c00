// Command imagebuild writes the project's container images as OCI archives
// from binaries already built, with no registry, no daemon and no base
// image: the binaries are static, so an image is one layer holding them and
// a config naming the entrypoint. It exists so that `make images` works on a
// machine that reaches nothing but the Go module proxy, and so that the same
// commit always gives the same image digest (fixed times, owners, modes and
// entry order). It is a build tool, never shipped.
//
//	go run ./hack/imagebuild -ref ghcr.io/datum-cloud/galactic-node:v1 \
//	    -add bin/galactic-node=/usr/local/bin/galactic-node \
//	    -entrypoint /usr/local/bin/galactic-node -epoch 1700000000 \
//	    -out bin/galactic-node.oci.tar -digest-file bin/galactic-node.digest
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// refNameAnnotation names the image in index.json; podman, skopeo and
// containerd's import read it to tag what they load.
const refNameAnnotation = "org.opencontainers.image.ref.name"

// spec is one image to write.
type spec struct {
	ref        string            // name:tag given to loaders
	files      []file            // binaries to put in the image's one layer
	entrypoint string            // absolute path inside the image
	user       string            // config User; empty is root
	labels     map[string]string // config labels
	epoch      time.Time         // every timestamp in the image
	arch       string            // GOARCH the binaries were built for
	out        string            // the OCI archive to write
	digestFile string            // where the manifest digest goes; empty: nowhere
}

// file is a host file and where it goes in the image.
type file struct{ src, dst string }

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(os.Args[1:], os.Getenv, log); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "imagebuild: "+err.Error())
		os.Exit(1)
	}
}

func run(args []string, getenv func(string) string, log *slog.Logger) error {
	s, err := parseFlags(args, getenv)
	if err != nil {
		return err
	}
	digest, size, err := build(s)
	if err != nil {
		return err
	}
	log.Info("wrote image", "ref", s.ref, "archive", s.out, "bytes", size, "digest", digest.String())
	return nil
}

func parseFlags(args []string, getenv func(string) string) (*spec, error) {
	s := &spec{labels: map[string]string{}}
	var adds, labels listFlag
	var epoch string
	fs := flag.NewFlagSet("imagebuild", flag.ContinueOnError)
	fs.StringVar(&s.ref, "ref", "", "image name and tag, e.g. ghcr.io/datum-cloud/galactic-node:v1 (required)")
	fs.Var(&adds, "add", "SRC=DST: put host file SRC at absolute path DST, mode 0755 if SRC is executable, else 0644 (repeatable)")
	fs.StringVar(&s.entrypoint, "entrypoint", "", "entrypoint, an absolute path inside the image (required)")
	fs.StringVar(&s.user, "user", "", "config User, e.g. 65532:65532 (default root)")
	fs.Var(&labels, "label", "KEY=VALUE config label (repeatable)")
	fs.StringVar(&epoch, "epoch", getenv("SOURCE_DATE_EPOCH"), "seconds since 1970 for every timestamp (default $SOURCE_DATE_EPOCH; required)")
	fs.StringVar(&s.arch, "arch", runtime.GOARCH, "GOARCH the binaries were built for")
	fs.StringVar(&s.out, "out", "", "OCI archive to write (required)")
	fs.StringVar(&s.digestFile, "digest-file", "", "file to write the manifest digest to")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if s.ref == "" || s.entrypoint == "" || s.out == "" || len(adds) == 0 {
		return nil, errors.New("-ref, -add, -entrypoint and -out are required")
	}
	if epoch == "" {
		// Falling back to the clock would make every build differ.
		return nil, errors.New("-epoch or SOURCE_DATE_EPOCH is required")
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil || sec < 0 {
		return nil, fmt.Errorf("-epoch %q: want whole seconds since 1970", epoch)
	}
	s.epoch = time.Unix(sec, 0).UTC()
	for _, a := range adds {
		src, dst, ok := strings.Cut(a, "=")
		if !ok || src == "" || !path.IsAbs(dst) || path.Clean(dst) != dst || dst == "/" {
			return nil, fmt.Errorf("-add %q: want SRC=/absolute/clean/path", a)
		}
		s.files = append(s.files, file{src: src, dst: dst})
	}
	if !slices.ContainsFunc(s.files, func(f file) bool { return f.dst == s.entrypoint }) {
		return nil, fmt.Errorf("-entrypoint %s is none of the -add destinations", s.entrypoint)
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		s.labels[k] = v
	}
	// The OCI labels every image carries, from what is already fixed: the
	// build's time, and the repository's name.
	if _, ok := s.labels["org.opencontainers.image.created"]; !ok {
		s.labels["org.opencontainers.image.created"] = s.epoch.Format(time.RFC3339)
	}
	if _, ok := s.labels["org.opencontainers.image.title"]; !ok {
		repo, _, _ := strings.Cut(s.ref, ":")
		s.labels["org.opencontainers.image.title"] = path.Base(repo)
	}
	return s, nil
}

// build writes s.out (and s.digestFile) and returns the manifest digest and
// the archive's size. Both files appear whole or not at all.
func build(s *spec) (v1.Hash, int64, error) {
	img, err := image(s)
	if err != nil {
		return v1.Hash{}, 0, err
	}
	digest, err := img.Digest()
	if err != nil {
		return v1.Hash{}, 0, fmt.Errorf("digest of %s: %w", s.ref, err)
	}
	dir, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return v1.Hash{}, 0, fmt.Errorf("make layout folder: %w", err)
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, 0, fmt.Errorf("write OCI layout %s: %w", dir, err)
	}
	err = p.AppendImage(img, layout.WithAnnotations(map[string]string{refNameAnnotation: s.ref}))
	if err != nil {
		return v1.Hash{}, 0, fmt.Errorf("write %s to OCI layout: %w", s.ref, err)
	}
	var archive bytes.Buffer
	if err := tarFolder(&archive, dir, s.epoch); err != nil {
		return v1.Hash{}, 0, err
	}
	if err := writeFileAtomic(s.out, archive.Bytes()); err != nil {
		return v1.Hash{}, 0, err
	}
	if s.digestFile != "" {
		if err := writeFileAtomic(s.digestFile, []byte(digest.String()+"\n")); err != nil {
			return v1.Hash{}, 0, err
		}
	}
	return digest, int64(archive.Len()), nil
}

// image assembles the image in memory: an empty base, one layer, a config.
func image(s *spec) (v1.Image, error) {
	layerTar, err := layerTar(s.files, s.epoch)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.BestCompression))
	if err != nil {
		return nil, fmt.Errorf("make layer of %s: %w", s.ref, err)
	}
	created := v1.Time{Time: s.epoch}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: created, CreatedBy: "hack/imagebuild", Comment: "static binaries, no base"},
	})
	if err != nil {
		return nil, fmt.Errorf("add layer to %s: %w", s.ref, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config of %s: %w", s.ref, err)
	}
	cf = cf.DeepCopy()
	cf.Architecture = s.arch
	cf.OS = "linux"
	cf.Created = created
	cf.Config = v1.Config{
		Entrypoint: []string{s.entrypoint},
		User:       s.user,
		WorkingDir: "/",
		Labels:     s.labels,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config of %s: %w", s.ref, err)
	}
	return img, nil
}

// layerTar is the uncompressed layer: every parent folder of the files,
// then the files, in name order, owned by 0:0 and dated epoch, so the bytes
// depend on nothing but the files' contents.
func layerTar(files []file, epoch time.Time) ([]byte, error) {
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f.dst); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	type entry struct {
		name string
		src  string // empty for a folder
	}
	var entries []entry
	for d := range dirs {
		entries = append(entries, entry{name: strings.TrimPrefix(d, "/") + "/"})
	}
	seen := map[string]bool{}
	for _, f := range files {
		if seen[f.dst] || dirs[f.dst] {
			return nil, fmt.Errorf("image path %s given twice or also a folder", f.dst)
		}
		seen[f.dst] = true
		entries = append(entries, entry{name: strings.TrimPrefix(f.dst, "/"), src: f.src})
	}
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.name, b.name) })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, ModTime: epoch, Format: tar.FormatPAX}
		var data []byte
		if e.src == "" {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		} else {
			var err error
			if data, err = os.ReadFile(e.src); err != nil {
				return nil, fmt.Errorf("read %s: %w", e.src, err)
			}
			mode, err := fileMode(e.src)
			if err != nil {
				return nil, err
			}
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, mode, int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.name, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close layer: %w", err)
	}
	return buf.Bytes(), nil
}

// tarFolder writes the OCI layout in dir as a tar, the oci-archive format:
// names in order, folders 0755, files 0644, owned by 0:0, dated epoch.
func tarFolder(w io.Writer, dir string, epoch time.Time) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			rel += "/"
		} else if !d.Type().IsRegular() {
			return fmt.Errorf("%s is neither file nor folder", p)
		}
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return fmt.Errorf("walk OCI layout %s: %w", dir, err)
	}
	slices.Sort(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		h := &tar.Header{Name: n, ModTime: epoch, Format: tar.FormatPAX}
		var data []byte
		if strings.HasSuffix(n, "/") {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		} else {
			if data, err = os.ReadFile(filepath.Join(dir, n)); err != nil {
				return fmt.Errorf("read layout file: %w", err)
			}
			h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("archive entry %s: %w", n, err)
		}
		if _, err := tw.Write(data); err != nil {
			return fmt.Errorf("archive entry %s: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("close archive: %w", err)
	}
	return nil
}

// writeFileAtomic replaces name with data through a temporary file in the
// same folder, so an interrupted build never leaves a truncated archive
// under the final name.
func writeFileAtomic(name string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		return fmt.Errorf("rename into %s: %w", name, err)
	}
	return nil
}

// fileMode is an image file's mode: 0755 for a program (its source has an
// execute bit, which git keeps in every clone), 0644 for data.
func fileMode(src string) (int64, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return 0, fmt.Errorf("stat %s: %w", src, err)
	}
	if fi.Mode()&0o111 != 0 {
		return 0o755, nil
	}
	return 0o644, nil
}
