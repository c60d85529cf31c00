// Package opsdoc reads the commands docs/operations.md gives operators, so
// that the tests which run them (against a real API server, and on the e2e
// node) run what the page says, as written.
package opsdoc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

var shBlock = regexp.MustCompile("(?s)```sh\n(.*?)\n\\s*```")

// InstallSteps returns the sh blocks of the Install section of
// docs/operations.md under repoRoot, in order.
func InstallSteps(repoRoot string) ([]string, error) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	if err != nil {
		return nil, fmt.Errorf("read the install steps: %w", err)
	}
	_, section, ok := strings.Cut("\n"+string(doc), "\n## Install\n")
	if !ok {
		return nil, errors.New("docs/operations.md has no Install section")
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	var steps []string
	for _, m := range shBlock.FindAllStringSubmatch(section, -1) {
		steps = append(steps, m[1])
	}
	if len(steps) == 0 {
		return nil, errors.New("the Install section of docs/operations.md has no sh block")
	}
	return steps, nil
}
