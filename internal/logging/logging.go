// Package logging builds the one slog logger every binary logs through
// (internal/logging/klogroute routes client-go's klog output into it).
package logging

import (
	"fmt"
	"io"
	"log/slog"
)

// New returns a logger writing format ("json" or "text") at level
// ("debug", "info", "warn" or "error") to w. Durations are written as text
// ("1m0s"): slog's JSON handler writes them as integer nanoseconds, which
// nobody reading a log can tell apart from a count.
func New(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationText}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want json or text", format)
}

func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}
