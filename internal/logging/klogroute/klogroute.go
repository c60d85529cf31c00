// Package klogroute routes client-go's klog output into the daemons' slog
// logger, so that a log line is JSON (or text) whichever library wrote it.
// It is apart from internal/logging so that a binary that runs no client-go
// (the CNI plugin) links no klog.
package klogroute

import (
	"log/slog"

	"k8s.io/klog/v2"
)

// Into makes klog, which client-go's informers, reflectors and leader
// election log through, write through log instead of its own plain-text
// lines on stderr, which would break a JSON log stream. klog is
// process-global: call it once, at start-up, before client-go runs.
func Into(log *slog.Logger) {
	klog.SetSlogLogger(log)
}
