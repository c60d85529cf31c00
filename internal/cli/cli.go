// Package cli is the command-line convention every binary of this project
// follows: help asked for goes to stdout with exit 0; a usage mistake is
// one line and a hint on stderr with exit 2; any other error is one line on
// stderr with exit 1. Flags also come from GALACTIC_* variables
// (internal/envflag), and a GALACTIC_* variable no flag owns is a mistake.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/datum-cloud/galactic-node/internal/envflag"
)

// UsageError is a mistake in how a command was invoked; Help is the
// command line that prints that command's usage.
type UsageError struct {
	Err  error
	Help string
}

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Misuse marks err, found in the invocation of command (as in "galactic-node
// run"), as a usage mistake.
func Misuse(command string, err error) error {
	if err == nil {
		return nil
	}
	return &UsageError{Err: err, Help: command + " --help"}
}

// Parse parses args into fs, named for its command ("galactic-node run"),
// then sets every flag not given from its GALACTIC_* variable in environ
// (os.Environ's form). A GALACTIC_* variable not in known is refused; known
// is every flag of every command of the binary, since one environment is
// often shared by several of them (a DaemonSet's init and main container).
//
// -h or --help prints the usage (synopsis, then the flags) to stdout and
// returns flag.ErrHelp. An unknown flag, a bad value, a stray argument or an
// unknown variable returns a *UsageError of one line: the flag package
// would print the whole usage on stderr, burying the one line that matters.
func Parse(fs *flag.FlagSet, synopsis string, args []string, environ []string, known map[string]bool, stdout io.Writer) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			PrintUsage(stdout, fs, synopsis)
			return flag.ErrHelp
		}
		return Misuse(fs.Name(), errors.New(flagMessage(err.Error())))
	}
	if fs.NArg() > 0 {
		return Misuse(fs.Name(), fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if known != nil {
		if err := envflag.Unknown(environ, known); err != nil {
			return Misuse(fs.Name(), err)
		}
	}
	if err := envflag.Set(fs, Lookup(environ)); err != nil {
		return Misuse(fs.Name(), err)
	}
	return nil
}

// Lookup is os.LookupEnv over environ.
func Lookup(environ []string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := "", false
		for _, kv := range environ {
			if k, val, found := strings.Cut(kv, "="); found && k == name {
				v, ok = val, true // the last wins, as in the C library
			}
		}
		return v, ok
	}
}

// flagMessage says the flag package's errors in the form a user types the
// flags in: with two dashes.
func flagMessage(msg string) string {
	for _, r := range [][2]string{
		{"flag provided but not defined: -", "unknown flag --"},
		{"flag needs an argument: -", "flag needs a value: --"},
		{" for flag -", " for flag --"},
		{" for -", " for --"},
	} {
		if strings.Contains(msg, r[0]) {
			return strings.Replace(msg, r[0], r[1], 1)
		}
	}
	return msg
}

// PrintUsage writes synopsis and fs's flags to w.
func PrintUsage(w io.Writer, fs *flag.FlagSet, synopsis string) {
	fmt.Fprintf(w, "usage: %s\n\nflags:\n", synopsis)
	out := fs.Output()
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(out)
	fmt.Fprintf(w, "\nEvery flag can also be set as %s<FLAG> (upper case, dashes as underscores).\n", envflag.Prefix)
}

// ExitError is an error with an exit code of its own, for commands that
// tell scripts more than failed (the admin client: 3 refused, 4 not done,
// 5 retry later).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// Exit reports err on stderr as "error: …", kubectl's one prefix for every
// error, and returns the exit code: 0 for none (or flag.ErrHelp: help was
// asked for and printed), 2 for a usage mistake, which also gets the hint
// of how to see the usage, an *ExitError's code, and 1 for anything else.
// The program's name is not in the line: the hint names the binary, and kubectl's form is
// what operators' scripts and eyes already know.
func Exit(stderr io.Writer, _ string, err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	// One line, whatever the error: joined errors hold newlines.
	msg := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
	fmt.Fprintf(stderr, "error: %s\n", msg)
	var u *UsageError
	if errors.As(err, &u) {
		fmt.Fprintf(stderr, "Run '%s' for usage.\n", u.Help)
		return 2
	}
	var e *ExitError
	if errors.As(err, &e) {
		return e.Code
	}
	return 1
}
