// Package envflag sets command-line flags from GALACTIC_* environment
// variables, the one convention of this project's binaries: the command
// line wins over the environment, and a GALACTIC_* variable that is no
// flag's is an error.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Name is the environment variable of flag name: GALACTIC_ and the name in
// upper case, dashes as underscores.
func Name(flagName string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Set sets every flag of fs not given on the command line from its
// variable, if lookup finds one (os.LookupEnv in the binaries).
func Set(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		env := Name(f.Name)
		if v, ok := lookup(env); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
			}
		}
	})
	return errors.Join(errs...)
}

// Prefix starts every variable this package reads.
const Prefix = "GALACTIC_"

// Names returns the variable of every flag of sets: what a binary knows,
// given the flag sets of all its commands.
func Names(sets ...*flag.FlagSet) map[string]bool {
	known := map[string]bool{}
	for _, fs := range sets {
		fs.VisitAll(func(f *flag.Flag) { known[Name(f.Name)] = true })
	}
	return known
}

// Unknown returns an error naming every GALACTIC_* variable of environ
// (os.Environ's form) that is not in known, and the known one it most
// likely misspells: a misspelt variable would otherwise be ignored, and
// the flag it meant left at its default without a word.
func Unknown(environ []string, known map[string]bool) error {
	var bad []string
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, Prefix) || known[name] || serviceLink(name, value) {
			continue
		}
		if near := closest(name, known); near != "" {
			name += " (did you mean " + near + "?)"
		}
		bad = append(bad, name)
	}
	if len(bad) == 0 {
		return nil
	}
	slices.Sort(bad)
	return fmt.Errorf("unknown environment variable %s", strings.Join(bad, ", "))
}

// serviceLinkName matches the names the kubelet gives a Service's
// variables (pkg/kubelet/envvars): <SVC>_SERVICE_HOST, <SVC>_SERVICE_PORT,
// <SVC>_SERVICE_PORT_<PORTNAME>, and Docker's link variables
// <SVC>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]. <SVC>_PORT alone is told by
// its value (serviceLinkURL), as a flag could be named ..._PORT. They are
// compiled when a variable is judged, not at package init, which every
// process importing this package (each CNI verb among them) would pay for.
const (
	serviceLinkName = `_SERVICE_HOST$|_SERVICE_PORT$|_SERVICE_PORT_[A-Z0-9_]+$|_PORT_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?$`
	serviceLinkURL  = `^(tcp|udp|sctp)://`
)

// serviceLink reports whether name=value is a variable the kubelet injects
// for a Service of the pod's namespace (unless the pod sets
// enableServiceLinks: false): a Service named galactic-… becomes
// GALACTIC_…_SERVICE_HOST and the like, which no flag owns and no operator
// wrote, so refusing it would crash-loop the pod over its neighbours.
func serviceLink(name, value string) bool {
	if regexp.MustCompile(serviceLinkName).MatchString(name) {
		return true
	}
	return strings.HasSuffix(name, "_PORT") && regexp.MustCompile(serviceLinkURL).MatchString(value)
}

// closest is the known name a few edits from name, if one is: at most one
// edit in three of the part after the prefix, so that a typo finds its
// flag and an unrelated name finds nothing.
func closest(name string, known map[string]bool) string {
	suffix := strings.TrimPrefix(name, Prefix)
	best, bestD := "", len(suffix)/3+1
	for k := range known {
		d := distance(suffix, strings.TrimPrefix(k, Prefix))
		if d < bestD || (d == bestD && best != "" && k < best) {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
