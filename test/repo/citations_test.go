package repotest

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// outside are citations of material that lived beside the repository while
// it was written and is not shipped with it; what they pointed to is in
// docs/. Split so that this file does not match itself.
var outside = []string{"../" + "shared", "shared/" + "reference"}

// cited are the kinds of files whose comments cite other material.
var cited = map[string]bool{".go": true, ".c": true, ".h": true, ".sh": true, ".yaml": true, ".yml": true}

// A reader of the repository has only the repository: every comment that
// cites a document must name one in it (docs/), never a path outside it.
func TestNoFileCitesMaterialOutsideTheRepository(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") && name != ".ci" || name == "bin" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !cited[filepath.Ext(path)] {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		rel, _ := filepath.Rel(root, path)
		for i, line := range strings.Split(string(b), "\n") {
			for _, o := range outside {
				if strings.Contains(line, o) {
					t.Errorf("%s:%d cites %q, outside the repository; point to docs/ instead: %s", rel, i+1, o, strings.TrimSpace(line))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked only %d files under %s; the walk missed the repository", checked, root)
	}
}
