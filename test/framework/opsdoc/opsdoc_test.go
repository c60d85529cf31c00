package opsdoc

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestInstallStepsAreTheShBlocksOfTheInstallSectionOnly(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      []string // nil: an error
	}{
		{"two steps", "# Ops\n## Install\ntext\n```sh\nkubectl a\n```\n\n   ```sh\n   kubectl b \\\n     --c\n   ```\n## Upgrade\n```sh\nkubectl later\n```\n",
			[]string{"kubectl a", "   kubectl b \\\n     --c"}},
		{"yaml blocks are not steps", "## Install\n```yaml\nkind: X\n```\n```sh\nstep\n```\n", []string{"step"}},
		{"no Install section", "## Upgrade\n```sh\nkubectl\n```\n", nil},
		{"no sh block", "## Install\nnothing to run\n## Upgrade\n", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "docs"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "docs", "operations.md"), []byte(c.doc), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := InstallSteps(root)
			if c.want == nil {
				if err == nil {
					t.Fatalf("got %q, want an error", got)
				}
				return
			}
			if err != nil || !slices.Equal(got, c.want) {
				t.Fatalf("got %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestTheRepositorysInstallSectionHasSteps(t *testing.T) {
	steps, err := InstallSteps("../../..")
	if err != nil || len(steps) < 3 {
		t.Fatalf("docs/operations.md: %d steps, %v", len(steps), err)
	}
}
