package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestDurationsAreText(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		var buf bytes.Buffer
		log, err := New(&buf, format, "info")
		if err != nil {
			t.Fatal(err)
		}
		log.With("stuck_after", 10*time.Minute).WithGroup("g").Info("hello", "interval", time.Minute)
		out := buf.String()
		for _, want := range []string{"1m0s", "10m0s"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: %q lacks %s", format, out, want)
			}
		}
		if format == "json" {
			var m map[string]any
			if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
				t.Fatal(err)
			}
			if m["stuck_after"] != "10m0s" {
				t.Errorf("stuck_after %v, want \"10m0s\"", m["stuck_after"])
			}
		}
	}
}

func TestBadFormatOrLevelNamesTheFlag(t *testing.T) {
	if _, err := New(&bytes.Buffer{}, "xml", "info"); err == nil || !strings.Contains(err.Error(), "--log-format") {
		t.Errorf("format xml: %v", err)
	}
	if _, err := New(&bytes.Buffer{}, "json", "loud"); err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Errorf("level loud: %v", err)
	}
}
