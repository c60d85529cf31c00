// Command render writes a kustomization of deploy/ as one manifest, with
// the project's images pinned to the digests given and, where asked, to
// another registry: the galactic.yaml `make release` publishes, which a
// GitOps tool or `kubectl apply -f` takes as it is. A build tool, never
// shipped.
//
//	go run ./hack/render -version v1.0.0 -repo ghcr.io/datum-cloud \
//	    -digest galactic-node=sha256:… -digest galactic-hubctl=sha256:… \
//	    -out dist/galactic.yaml deploy
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// sourceRepo is where deploy/ names the images; the render replaces it.
const sourceRepo = "ghcr.io/datum-cloud"

var digestPattern = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "render: "+err.Error())
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	version := fs.String("version", "", "the release, written at the top of the manifest")
	repo := fs.String("repo", sourceRepo, "the registry and path the images are pulled from")
	out := fs.String("out", "", "the manifest to write")
	var digests listFlag
	fs.Var(&digests, "digest", "IMAGE=sha256:…: the digest of one of the project's images (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *version == "" || *out == "" || fs.NArg() != 1 || len(digests) == 0 {
		return errors.New("usage: render -version V [-repo REGISTRY/PATH] -digest IMAGE=sha256:… ... -out FILE KUSTOMIZATION-DIR")
	}
	pins := map[string]string{}
	for _, d := range digests {
		name, digest, ok := strings.Cut(d, "=")
		if !ok || strings.Contains(name, "/") || !digestPattern.MatchString(digest) {
			return fmt.Errorf("-digest %q: want IMAGE=sha256:<64 hex digits>", d)
		}
		pins[name] = digest
	}
	manifest, err := render(fs.Arg(0), strings.TrimSuffix(*repo, "/"), pins)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# galactic %s: rendered from %s by `make release`, images pinned by digest.\n", *version, filepath.ToSlash(filepath.Clean(fs.Arg(0))))
	fmt.Fprintf(&buf, "# Apply with `kubectl apply -f` (docs/operations.md, \"Install\").\n")
	buf.Write(manifest)
	return os.WriteFile(*out, buf.Bytes(), 0o644)
}

// render builds dir through a kustomization of its own, made beside it for
// the build and removed after, whose images: entries pin each image.
func render(dir, repo string, pins map[string]string) ([]byte, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", dir, err)
	}
	overlay, err := os.MkdirTemp(filepath.Dir(abs), ".render-")
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", dir, err)
	}
	defer os.RemoveAll(overlay)
	var k strings.Builder
	k.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n")
	fmt.Fprintf(&k, "resources: [../%s]\nimages:\n", filepath.Base(abs))
	names := make([]string, 0, len(pins))
	for name := range pins {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(&k, "  - name: %s/%s\n    newName: %s/%s\n    digest: %s\n", sourceRepo, name, repo, name, pins[name])
	}
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k.String()), 0o644); err != nil {
		return nil, fmt.Errorf("render %s: %w", dir, err)
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", dir, err)
	}
	out, err := rm.AsYaml()
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", dir, err)
	}
	for _, name := range names {
		if !bytes.Contains(out, []byte(repo+"/"+name+"@"+pins[name])) {
			return nil, fmt.Errorf("render %s: no container runs %s: is it one of this project's images?", dir, name)
		}
	}
	return out, nil
}
