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

var taggedBlock = regexp.MustCompile("(?s)```sh( [a-z-]+)?\n(.*?)\n\\s*```")

// Block is an sh block and where it runs: its fence's word after sh
// ("```sh node": on each node, as root), empty for an operator's shell
// with kubectl.
type Block struct {
	Where  string
	Script string
}

// Blocks returns the sh blocks of docs/operations.md's section under the
// heading given, in order.
func Blocks(repoRoot, heading string) ([]Block, error) {
	section, err := Section(repoRoot, heading)
	if err != nil {
		return nil, err
	}
	var blocks []Block
	for _, m := range taggedBlock.FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, Block{Where: strings.TrimSpace(m[1]), Script: m[2]})
	}
	if len(blocks) == 0 {
		return nil, fmt.Errorf("the section %q of docs/operations.md has no sh block", heading)
	}
	return blocks, nil
}

// Section returns the text of docs/operations.md's section under the
// second-level heading given, up to the next one.
func Section(repoRoot, heading string) (string, error) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "operations.md"))
	if err != nil {
		return "", fmt.Errorf("read docs/operations.md: %w", err)
	}
	_, section, ok := strings.Cut("\n"+string(doc), "\n## "+heading+"\n")
	if !ok {
		return "", fmt.Errorf("docs/operations.md has no section %q", heading)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	return section, nil
}

// Table returns the rows of the first table in the section, header and
// separator left out, each row's cells trimmed.
func Table(repoRoot, heading string) ([][]string, error) {
	section, err := Section(repoRoot, heading)
	if err != nil {
		return nil, err
	}
	var rows [][]string
	inTable := false
	for line := range strings.Lines(section) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		if !inTable {
			inTable = true // the header
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if strings.Trim(cells[0], " -:") == "" {
			continue // the separator
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("the section %q of docs/operations.md has no table", heading)
	}
	return rows, nil
}

// InstallSteps returns the sh blocks of the Install section of
// docs/operations.md under repoRoot, in order: an operator's shell's,
// the section having no other.
func InstallSteps(repoRoot string) ([]string, error) {
	blocks, err := Blocks(repoRoot, "Install")
	if err != nil {
		return nil, fmt.Errorf("read the install steps: %w", err)
	}
	var steps []string
	for _, b := range blocks {
		if b.Where == "" {
			steps = append(steps, b.Script)
		}
	}
	if len(steps) == 0 {
		return nil, errors.New("the Install section of docs/operations.md has no sh block")
	}
	return steps, nil
}
