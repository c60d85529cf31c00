package jsonlines

import (
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type event struct {
	At   time.Time `json:"at"`
	What string    `json:"what"`
}

func stampAt(e *event, now time.Time) {
	if e.At.IsZero() {
		e.At = now
	}
}

// TestLogRoundTrip: what is added is what the file reads back, in order,
// and an event added without a time gets one no earlier than the one
// before it, however many goroutines add.
func TestLogRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.jsonl")
	l, err := Create(path, stampAt)
	if err != nil {
		t.Fatal(err)
	}
	given := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	l.Add(event{At: given, What: "given"})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				l.Add(event{What: "stamped"})
			}
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	read, err := ReadFile[event](path)
	if err != nil {
		t.Fatal(err)
	}
	mem := l.Events()
	if len(read) != 801 || len(mem) != 801 {
		t.Fatalf("read %d events, memory %d; want 801", len(read), len(mem))
	}
	if !read[0].At.Equal(given) {
		t.Errorf("a given time was replaced: %v", read[0].At)
	}
	for i := 1; i < len(read); i++ {
		if !read[i].At.Equal(mem[i].At) || read[i].What != mem[i].What {
			t.Fatalf("line %d: file %+v, memory %+v", i+1, read[i], mem[i])
		}
		if i > 1 && read[i].At.Before(read[i-1].At) {
			t.Fatalf("line %d is stamped before line %d", i+1, i)
		}
	}
}

// TestReadNamesTheBadLine: a torn or foreign line is an error that says
// which, with the events before it.
func TestReadNamesTheBadLine(t *testing.T) {
	in := `{"what":"a"}` + "\n" + `{"what":"b"}` + "\n" + `{"what":` + "\n"
	events, err := Read[event](strings.NewReader(in))
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("err = %v; want one naming line 3", err)
	}
	if len(events) != 2 {
		t.Fatalf("got %d events before the bad line, want 2", len(events))
	}
}
