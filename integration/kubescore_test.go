package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/datum-cloud/galactic-node/test/framework/opsdoc"
)

// kubeScoreSection is docs/operations.md's list of the findings kept.
const kubeScoreSection = "What kube-score flags, and why it stays"

// kubeScoreLine is a line of `kube-score score -o ci`:
// "[CRITICAL] name/namespace apps/v1/Kind: (container) message", or an
// object's line with no message ("[OK] name/namespace v1/Kind").
var kubeScoreLine = regexp.MustCompile(`^\[(\w+)\] ([^/ ]+)/\S+ (?:\S+/)?(\w+)(?:: (?:\(([^)]+)\) )?(.+))?$`)

// TestKubeScoreFindsOnlyWhatOperationsMdKeeps runs the pinned kube-score,
// an outside linter, on deploy/ as kustomize renders it, and holds what it
// finds (anything not OK or skipped) to docs/operations.md's table of the
// findings kept and why: a new finding is fixed or listed there with its
// reason, and a row it no longer finds is struck.
func TestKubeScoreFindsOnlyWhatOperationsMdKeeps(t *testing.T) {
	if testing.Short() {
		t.Skip("builds kube-score once per machine (hack/kube-score.sh)")
	}
	out, err := exec.Command("../hack/kube-score.sh").Output()
	if err != nil {
		t.Fatalf("hack/kube-score.sh: %v", err)
	}
	kubeScore := strings.TrimSpace(string(out))
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "../deploy")
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := rm.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	rendered := filepath.Join(t.TempDir(), "deploy.yaml")
	if err := os.WriteFile(rendered, manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	// kube-score exits 1 when it finds anything: its output says what.
	report, _ := exec.Command(kubeScore, "score", "--output-format", "ci", "--color", "never", rendered).Output()
	var found []string
	for line := range strings.Lines(string(report)) {
		line = strings.TrimSpace(line)
		m := kubeScoreLine.FindStringSubmatch(line)
		if m == nil {
			if line != "" {
				t.Errorf("a line of kube-score's that this test cannot read: %q", line)
			}
			continue
		}
		if m[1] == "OK" || m[1] == "SKIPPED" {
			continue
		}
		found = append(found, finding(m[3]+" "+m[2], m[4], m[5]))
	}
	if len(found) == 0 {
		t.Fatalf("kube-score found nothing at all, not even what the table keeps: is this its report?\n%s", report)
	}

	rows, err := opsdoc.Table("..", kubeScoreSection)
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, r := range rows {
		if len(r) != 4 || r[3] == "" {
			t.Fatalf("docs/operations.md, %q: row %q wants an object, containers, the finding and why it stays", kubeScoreSection, r)
		}
		containers := strings.Split(r[1], ",")
		for _, c := range containers {
			kept = append(kept, finding(r[0], strings.TrimSpace(c), r[2]))
		}
	}
	slices.Sort(found)
	found = slices.Compact(found)
	slices.Sort(kept)
	for _, f := range found {
		if !slices.Contains(kept, f) {
			t.Errorf("kube-score finds %s, which docs/operations.md (%q) does not keep: fix the manifest, or list it with the reason it stays", f, kubeScoreSection)
		}
	}
	for _, k := range kept {
		if !slices.Contains(found, k) {
			t.Errorf("docs/operations.md keeps %s, which kube-score no longer finds: strike the row", k)
		}
	}
}

func finding(object, container, message string) string {
	if container == "" {
		return fmt.Sprintf("%s: %s", object, message)
	}
	return fmt.Sprintf("%s (%s): %s", object, container, message)
}
