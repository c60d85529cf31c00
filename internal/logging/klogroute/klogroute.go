// Package klogroute routes client-go's klog output into the daemons' slog
// logger, so that a log line is JSON (or text) whichever library wrote it.
// It is apart from internal/logging so that a binary that runs no client-go
// (the CNI plugin) links no klog.
package klogroute

import (
	"log/slog"
	"sync"

	"k8s.io/klog/v2"
)

// routed makes Into take effect once per process: klog is process-global,
// and every client-go request reads it, so a second routing while a client
// runs would race with it (a test that runs a daemon's main function more
// than once in one process does exactly that).
var routed sync.Once

// Into makes klog, which client-go's informers, reflectors and leader
// election log through, write through log instead of its own plain-text
// lines on stderr, which would break a JSON log stream. Call it at
// start-up, before client-go runs; the first call in a process wins.
func Into(log *slog.Logger) {
	routed.Do(func() { klog.SetSlogLogger(log) })
}
