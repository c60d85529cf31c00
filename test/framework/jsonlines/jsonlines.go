// Package jsonlines records a test's events in memory and, one JSON object
// a line, to a file that a failed run leaves behind for a person or a later
// run to read again. The robustness harnesses (test/robustness and its hub
// half) keep their histories with it; each defines its own event type.
package jsonlines

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Log holds the events added to it, in the order they were added, and
// writes each to its file as it comes. Safe for concurrent use.
type Log[E any] struct {
	stamp func(e *E, now time.Time)

	mu     sync.Mutex
	f      *os.File
	w      *bufio.Writer
	events []E
	err    error // the first write that failed; later lines are kept in memory only
}

// Create writes a log to path. stamp, called under the log's lock as each
// event is added, gives an event without a time the current one: stamping
// under the lock keeps the file's order and its times in agreement, which
// a checker of the history may rely on.
func Create[E any](path string, stamp func(e *E, now time.Time)) (*Log[E], error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create history: %w", err)
	}
	return &Log[E]{stamp: stamp, f: f, w: bufio.NewWriter(f)}, nil
}

// Add records e.
func (l *Log[E]) Add(e E) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stamp(&e, time.Now())
	l.events = append(l.events, e)
	if l.err != nil {
		return
	}
	line, err := json.Marshal(e)
	if err == nil {
		_, err = l.w.Write(append(line, '\n'))
	}
	if err != nil {
		l.err = fmt.Errorf("write history: %w", err)
	}
}

// Events returns a copy of what was recorded so far.
func (l *Log[E]) Events() []E {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]E(nil), l.events...)
}

// Flush writes what is buffered to the file, or reports the first write
// that failed.
func (l *Log[E]) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if err := l.w.Flush(); err != nil {
		return fmt.Errorf("flush history: %w", err)
	}
	return nil
}

// Close flushes and closes the file.
func (l *Log[E]) Close() error {
	err := l.Flush()
	l.mu.Lock()
	defer l.mu.Unlock()
	return errors.Join(err, l.f.Close())
}

// Read reads a log back, to check it again. A line that does not decode
// is an error naming it; the events before it are returned with it.
func Read[E any](r io.Reader) ([]E, error) {
	var events []E
	sc := bufio.NewScanner(r)
	// A node's view of its taps is one line; a thousand taps fit well
	// within the bound.
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		var e E
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return events, fmt.Errorf("read history: line %d: %w", n, err)
		}
		events = append(events, e)
	}
	if err := sc.Err(); err != nil {
		return events, fmt.Errorf("read history: %w", err)
	}
	return events, nil
}

// ReadFile reads the log at path.
func ReadFile[E any](path string) ([]E, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open history: %w", err)
	}
	defer f.Close()
	return Read[E](f)
}
