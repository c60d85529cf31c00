// Package netns runs a function inside a network namespace given by an open
// file (a /run/netns/NAME or /proc/PID/ns/net handle).
//
// Namespaces belong to OS threads, not goroutines. Do runs the function on a
// fresh goroutine locked to its thread and switches back before unlocking; if
// switching back fails the thread is never returned to the Go scheduler, so no
// other goroutine can later run in the wrong namespace.
//
// Network namespaces are Linux's: elsewhere Do runs a function only where the
// caller is (a nil ns) and refuses to switch, so that packages which import
// this one still build there.
package netns
