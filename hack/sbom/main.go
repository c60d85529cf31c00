// Command sbom writes the software bill of materials of a container image
// built from Go binaries: a CycloneDX 1.5 JSON document that lists, for
// each binary, the Go modules its build information records (what `go
// version -m` prints) and the Go toolchain that built it. It reads only the
// binaries, so the SBOM describes exactly what ships, and it is
// deterministic: no serial number, the timestamp SOURCE_DATE_EPOCH's (the
// images' own), entries sorted, so two builds of a commit give one file.
// `make images` puts it into each image at /usr/share/sbom/<image>.cdx.json
// and `make release` writes it beside the archives. A build tool, never
// shipped.
//
//	go run ./hack/sbom -image ghcr.io/datum-cloud/galactic-node -version v1.0.0 \
//	    -epoch 1700000000 -out bin/galactic-node.cdx.json \
//	    bin/static/galactic-node=/usr/local/bin/galactic-node bin/static/galactic-tap=/usr/local/bin/galactic-tap
package main

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"runtime/debug"
	"slices"
	"strings"
	"time"
)

// The document's fixed parts.
const (
	specVersion = "1.5"
	license     = "Apache-2.0"
)

// BOM is the subset of CycloneDX 1.5 (https://cyclonedx.org/docs/1.5/json/)
// this tool writes.
type BOM struct {
	BOMFormat    string       `json:"bomFormat"`
	SpecVersion  string       `json:"specVersion"`
	Version      int          `json:"version"`
	Metadata     Metadata     `json:"metadata"`
	Components   []Component  `json:"components"`
	Dependencies []Dependency `json:"dependencies"`
}

// Metadata says what the BOM describes and when it was made.
type Metadata struct {
	Timestamp string    `json:"timestamp"`
	Tools     Tools     `json:"tools"`
	Component Component `json:"component"`
}

// Tools names what wrote the BOM.
type Tools struct {
	Components []Component `json:"components"`
}

// Component is the image, one of its binaries, a module or the toolchain.
type Component struct {
	Type       string     `json:"type"`
	BOMRef     string     `json:"bom-ref,omitempty"`
	Name       string     `json:"name"`
	Version    string     `json:"version,omitempty"`
	PURL       string     `json:"purl,omitempty"`
	Licenses   []License  `json:"licenses,omitempty"`
	Hashes     []Hash     `json:"hashes,omitempty"`
	Properties []Property `json:"properties,omitempty"`
}

// License is an SPDX license by its identifier.
type License struct {
	License struct {
		ID string `json:"id"`
	} `json:"license"`
}

// Hash is a component's digest.
type Hash struct {
	Alg     string `json:"alg"`
	Content string `json:"content"`
}

// Property is a name-value pair the spec leaves to the tool.
type Property struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Dependency says which components a component contains or needs.
type Dependency struct {
	Ref       string   `json:"ref"`
	DependsOn []string `json:"dependsOn"`
}

// binary is a built binary and where the image holds it.
type binary struct{ src, dst string }

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "sbom: "+err.Error())
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("sbom", flag.ContinueOnError)
	image := fs.String("image", "", "the image's repository, e.g. ghcr.io/datum-cloud/galactic-node")
	version := fs.String("version", "", "the image's version (its tag)")
	epoch := fs.Int64("epoch", -1, "the document's time, in seconds since 1970 (the images' SOURCE_DATE_EPOCH)")
	out := fs.String("out", "", "where to write the SBOM (empty: standard output)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *image == "" || *version == "" || *epoch < 0 || fs.NArg() == 0 {
		return errors.New("usage: sbom -image REPO -version V -epoch SECONDS [-out FILE] BINARY=PATH-IN-IMAGE ...; at least one binary")
	}
	var bins []binary
	for _, a := range fs.Args() {
		src, dst, ok := strings.Cut(a, "=")
		if !ok || src == "" || !path.IsAbs(dst) {
			return fmt.Errorf("%q: want BINARY=/ABSOLUTE/PATH/IN/IMAGE", a)
		}
		bins = append(bins, binary{src, dst})
	}
	bom, err := build(*image, *version, time.Unix(*epoch, 0), bins)
	if err != nil {
		return err
	}
	b, err := encode(bom)
	if err != nil {
		return err
	}
	if *out == "" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(*out, b, 0o644)
}

// build reads each binary's build information into one BOM for the image.
func build(image, version string, at time.Time, bins []binary) (*BOM, error) {
	// The image is named without its registry, so that the SBOM, which
	// the image carries, and so the image's digest, are the same whichever
	// registry a release is rendered for. Its package URL has no version:
	// an oci purl's version is the image's digest, which the image cannot
	// know of itself; the tag says which release it is.
	name := path.Base(image)
	imageRef := "pkg:oci/" + name + "?tag=" + url.QueryEscape(version)
	bom := &BOM{
		BOMFormat:   "CycloneDX",
		SpecVersion: specVersion,
		Version:     1,
		Metadata: Metadata{
			Timestamp: at.UTC().Format(time.RFC3339),
			Tools: Tools{Components: []Component{{
				Type: "application", Name: "galactic-node/hack/sbom",
			}}},
			Component: Component{
				Type: "container", BOMRef: imageRef, Name: name, Version: version,
				PURL: imageRef, Licenses: licenses(license),
			},
		},
	}
	seen := map[string]bool{}
	imageDeps := Dependency{Ref: imageRef}
	for _, b := range bins {
		info, err := buildinfo.ReadFile(b.src)
		if err != nil {
			return nil, fmt.Errorf("read build information of %s: %w", b.src, err)
		}
		sum, err := fileSHA256(b.src)
		if err != nil {
			return nil, err
		}
		binRef := "file:" + b.dst
		imageDeps.DependsOn = append(imageDeps.DependsOn, binRef)
		bom.Components = append(bom.Components, Component{
			Type: "application", BOMRef: binRef, Name: path.Base(b.dst), Version: version,
			PURL:       goPURL(info.Path, version),
			Licenses:   licenses(license),
			Hashes:     []Hash{{Alg: "SHA-256", Content: sum}},
			Properties: buildProperties(b.dst, info),
		})
		deps := Dependency{Ref: binRef}
		toolchain := goPURL("stdlib", info.GoVersion)
		add := func(c Component) {
			deps.DependsOn = append(deps.DependsOn, c.BOMRef)
			if !seen[c.BOMRef] {
				seen[c.BOMRef] = true
				bom.Components = append(bom.Components, c)
			}
		}
		add(Component{Type: "library", BOMRef: toolchain, Name: "stdlib", Version: info.GoVersion, PURL: toolchain})
		for _, m := range info.Deps {
			add(module(m))
		}
		slices.Sort(deps.DependsOn)
		bom.Dependencies = append(bom.Dependencies, deps)
	}
	slices.Sort(imageDeps.DependsOn)
	bom.Dependencies = append(bom.Dependencies, imageDeps)
	slices.SortStableFunc(bom.Components, func(a, b Component) int { return strings.Compare(a.BOMRef, b.BOMRef) })
	slices.SortFunc(bom.Dependencies, func(a, b Dependency) int { return strings.Compare(a.Ref, b.Ref) })
	return bom, nil
}

// module is a dependency as the binary was built with it: a replaced
// module is listed as its replacement, since that is the code linked in,
// with the path it replaces as a property.
func module(m *debug.Module) Component {
	used := m
	var props []Property
	if m.Replace != nil {
		used = m.Replace
		props = append(props, Property{Name: "galactic:replaces", Value: m.Path + "@" + m.Version})
	}
	ref := goPURL(used.Path, used.Version)
	// go.sum's h1: hash is a SHA-256 of the module's file list, not of
	// any file one could download and check: a property, not a hash.
	if used.Sum != "" {
		props = append(props, Property{Name: "galactic:go-sum", Value: used.Sum})
	}
	return Component{Type: "library", BOMRef: ref, Name: used.Path, Version: used.Version, PURL: ref, Properties: props}
}

// buildProperties keeps what `go version -m` prints beside the modules:
// where the binary is, its toolchain and its build settings.
func buildProperties(dst string, info *buildinfo.BuildInfo) []Property {
	props := []Property{
		{Name: "galactic:path-in-image", Value: dst},
		{Name: "galactic:go-package", Value: info.Path},
		{Name: "galactic:go-version", Value: info.GoVersion},
	}
	for _, s := range info.Settings {
		props = append(props, Property{Name: "galactic:build:" + s.Key, Value: s.Value})
	}
	return props
}

// goPURL is a Go module's package URL (github.com/package-url/purl-spec,
// type golang): the path's segments escaped one by one, as the spec asks.
func goPURL(modPath, version string) string {
	segs := strings.Split(modPath, "/")
	for i, s := range segs {
		segs[i] = purlEscape(s)
	}
	p := "pkg:golang/" + strings.Join(segs, "/")
	if version != "" && version != "(devel)" {
		p += "@" + purlEscape(version)
	}
	return p
}

// purlEscape percent-encodes what the purl spec does not allow bare in a
// segment or version: url.PathEscape leaves "+" (as in +incompatible)
// and a few others alone.
func purlEscape(s string) string {
	return strings.NewReplacer("+", "%2B", "@", "%40", "?", "%3F", "#", "%23").Replace(url.PathEscape(s))
}

func licenses(id string) []License {
	var l License
	l.License.ID = id
	return []License{l}
}

// encode writes the BOM as indented JSON, without HTML escaping so that a
// package URL's "&" reads as itself.
func encode(bom *BOM) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(bom); err != nil {
		return nil, fmt.Errorf("encode SBOM: %w", err)
	}
	return buf.Bytes(), nil
}

// fileSHA256 is the hex SHA-256 of a file's bytes.
func fileSHA256(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", name, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", name, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
