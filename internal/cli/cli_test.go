package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/internal/envflag"
)

func newFlags() (*flag.FlagSet, *time.Duration) {
	fs := flag.NewFlagSet("prog run", flag.ContinueOnError)
	return fs, fs.Duration("interval", time.Minute, "time between passes")
}

func TestHelpGoesToStdoutAndExitsZero(t *testing.T) {
	fs, _ := newFlags()
	var stdout, stderr bytes.Buffer
	err := Parse(fs, "prog run [flags]", []string{"-h"}, nil, nil, &stdout)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if !strings.Contains(stdout.String(), "usage: prog run [flags]") || !strings.Contains(stdout.String(), "-interval") {
		t.Errorf("usage on stdout:\n%s", stdout.String())
	}
	if code := Exit(&stderr, "prog", err); code != 0 || stderr.Len() != 0 {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

func TestAMistakeIsOneLineAndAHintAndExitsTwo(t *testing.T) {
	known := map[string]bool{"GALACTIC_INTERVAL": true}
	for _, tc := range []struct {
		args    []string
		environ []string
		want    string
	}{
		{[]string{"--intervall=1m"}, nil, "error: unknown flag --intervall"},
		{[]string{"--interval=soon"}, nil, `error: invalid value "soon" for flag --interval`},
		{[]string{"--interval"}, nil, "error: flag needs a value: --interval"},
		{[]string{"stray"}, nil, `error: unexpected argument "stray"`},
		{nil, []string{"GALACTIC_INTERVALL=1m"}, "error: unknown environment variable GALACTIC_INTERVALL (did you mean GALACTIC_INTERVAL?)"},
		{nil, []string{"GALACTIC_INTERVAL=soon"}, "error: GALACTIC_INTERVAL: parse error"},
	} {
		fs, _ := newFlags()
		var stdout, stderr bytes.Buffer
		err := Parse(fs, "prog run [flags]", tc.args, tc.environ, known, &stdout)
		code := Exit(&stderr, "prog", err)
		lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
		if code != 2 || len(lines) != 2 || !strings.HasPrefix(lines[0], tc.want) || lines[1] != "Run 'prog run --help' for usage." || stdout.Len() != 0 {
			t.Errorf("%v %v: exit %d, stderr %q, stdout %q; want 2 and %q and the hint", tc.args, tc.environ, code, stderr.String(), stdout.String(), tc.want)
		}
	}
}

func TestTheEnvironmentSetsWhatTheCommandLineDoesNot(t *testing.T) {
	fs, interval := newFlags()
	env := []string{envflag.Name("interval") + "=5m"}
	if err := Parse(fs, "", nil, env, map[string]bool{"GALACTIC_INTERVAL": true}, &bytes.Buffer{}); err != nil || *interval != 5*time.Minute {
		t.Errorf("interval %v, %v; want 5m from the environment", *interval, err)
	}
	fs, interval = newFlags()
	if err := Parse(fs, "", []string{"--interval=2m"}, env, nil, &bytes.Buffer{}); err != nil || *interval != 2*time.Minute {
		t.Errorf("interval %v, %v; want 2m from the command line", *interval, err)
	}
}

func TestOtherErrorsExitOne(t *testing.T) {
	var stderr bytes.Buffer
	if code := Exit(&stderr, "prog", errors.Join(errors.New("open x: denied"), errors.New("and more"))); code != 1 || stderr.String() != "error: open x: denied; and more\n" {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

// An *ExitError keeps its own code, under the same one-line form.
func TestAnExitErrorKeepsItsCode(t *testing.T) {
	var stderr bytes.Buffer
	if code := Exit(&stderr, "prog", fmt.Errorf("pass: %w", &ExitError{Code: 4, Err: errors.New("braked")})); code != 4 || stderr.String() != "error: pass: braked\n" {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}
