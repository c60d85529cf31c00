// Package repotest holds tests of the repository's own text, not of any
// package's behaviour: that what a file cites can be found from the repo,
// and that the hub and admin packages build off Linux.
package repotest
