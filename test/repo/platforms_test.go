package repotest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/tools/go/packages"
)

// The hub controller and the admin API (with the operator's client of it)
// must build on systems other than Linux: Linux-only code lives in _linux.go
// files beside a _other.go that fails clearly (issue 18 point 5).
// Type-checking them, tests included, as darwin would build them means a new
// unix.* call outside a _linux.go file fails here, not on a developer's
// laptop.
//
// The check type-checks from source instead of running `GOOS=darwin go vet`:
// vet compiles every dependency for darwin, which from an empty build cache
// cost 8 minutes of CPU on the CI machine, where this costs seconds.
// Dependencies' function bodies are dropped before type-checking (only
// their declarations shape this repository's code), so only this
// repository's files are held to type errors; a dependency whose build
// constraints leave nothing for darwin still fails, as a load error.
func TestHubAndAdminBuildOffLinux(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checks the hub and admin packages and their dependencies for darwin")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	ours := func(file string) bool { return strings.HasPrefix(file, root+string(filepath.Separator)) }
	cfg := &packages.Config{
		Context: t.Context(),
		Mode: packages.NeedName | packages.NeedFiles | packages.NeedImports | packages.NeedDeps |
			packages.NeedTypes | packages.NeedSyntax,
		Dir:   root,
		Env:   append(os.Environ(), "GOOS=darwin"),
		Tests: true,
		ParseFile: func(fset *token.FileSet, file string, src []byte) (*ast.File, error) {
			f, err := parser.ParseFile(fset, file, src, parser.SkipObjectResolution)
			if f != nil && !ours(file) {
				for _, d := range f.Decls {
					if fn, ok := d.(*ast.FuncDecl); ok {
						fn.Body = nil
					}
				}
			}
			return f, err
		},
	}
	pkgs, err := packages.Load(cfg, "./hubctl/...", "./admin/...")
	if err != nil {
		t.Fatalf("load ./hubctl/... ./admin/... for darwin: %v", err)
	}
	if len(pkgs) == 0 {
		t.Fatal("load ./hubctl/... ./admin/... for darwin: no packages")
	}
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		for _, e := range p.Errors {
			// A type error in a dependency's file comes from its dropped
			// bodies; every other error counts.
			if e.Kind == packages.TypeError && !ours(strings.SplitN(e.Pos, ":", 2)[0]) {
				continue
			}
			t.Errorf("GOOS=darwin %s: %s", p.PkgPath, e)
		}
	})
}
