// Package envflag sets command-line flags from GALACTIC_* environment
// variables, the one convention of this project's binaries: the command
// line wins over the environment.
package envflag

import (
	"errors"
	"flag"
	"fmt"
	"strings"
)

// Name is the environment variable of flag name: GALACTIC_ and the name in
// upper case, dashes as underscores.
func Name(flagName string) string {
	return "GALACTIC_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
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
