package brakefile_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
	"github.com/datum-cloud/galactic-node/node/reclaim"
	"github.com/datum-cloud/galactic-node/node/reclaim/brakefile"
	"github.com/datum-cloud/galactic-node/node/teardown"
)

func memory() reclaim.BrakeMemory {
	at := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	id := identity.Identity{VPC: 10, Attachment: 3}
	return reclaim.BrakeMemory{
		Brake:    reclaim.Brake{Engaged: true, Since: at, Reason: "the identities the cluster carries fell from 17 to 5", Held: 4, ReleasesAt: at.Add(time.Hour)},
		Lowest:   5,
		LowestAt: at,
		Sizes:    []reclaim.SizeSample{{At: at.Add(-time.Minute), Identities: 17}, {At: at, Identities: 5}},
		Accepted: []reclaim.AcceptedTap{{Tap: teardown.TapRef{Ifindex: 7, Name: id.TapName(), Owner: "sandbox", Identity: id}, FirstSeen: at}},
	}
}

func TestTheMemoryRoundTrips(t *testing.T) {
	f := brakefile.File{Path: filepath.Join(t.TempDir(), "state", "brake.json")}
	if m, err := f.Load(); err != nil || !reflect.DeepEqual(m, reclaim.BrakeMemory{}) {
		t.Fatalf("missing file: %+v %v, want no history", m, err)
	}
	want := memory()
	if err := f.Save(want); err != nil {
		t.Fatal(err)
	}
	got, err := f.Load()
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("loaded %+v %v\nwant %+v", got, err, want)
	}
	if fi, err := os.Stat(f.Path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the file's mode: %v %v, want 0600", fi.Mode(), err)
	}
}

// A killed writer's temporary file goes with the next save; the memory it
// was writing never counts.
func TestASaveRemovesWhatAKilledWriterLeft(t *testing.T) {
	dir := t.TempDir()
	f := brakefile.File{Path: filepath.Join(dir, "brake.json")}
	left := filepath.Join(dir, ".brake.json.tmp-123456")
	if err := os.WriteFile(left, []byte(`{"version":1,"memory":{"brake":{"eng`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.Save(memory()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the killed writer's file is still there: %v", err)
	}
}

// A file that does not parse, or of another format version, is moved aside
// for an operator and reported as ErrUnreadable; the next Load finds none.
func TestAnUnreadableFileIsMovedAside(t *testing.T) {
	for name, body := range map[string]string{
		"truncated":     `{"version":1,"memory":{"brake":{"engaged":tr`,
		"other version": `{"version":99,"memory":{}}`,
		"empty":         ``,
		"no memory":     `{"version":1}`,
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			f := brakefile.File{Path: filepath.Join(dir, "brake.json")}
			if err := os.WriteFile(f.Path, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := f.Load()
			if !errors.Is(err, brakefile.ErrUnreadable) || !strings.Contains(err.Error(), "moved to "+f.Path+".unreadable-") {
				t.Fatalf("Load: %v, want ErrUnreadable naming where the file went", err)
			}
			if aside, _ := filepath.Glob(f.Path + ".unreadable-*"); len(aside) != 1 {
				t.Fatalf("moved aside: %v", aside)
			}
			if _, err := f.Load(); err != nil {
				t.Fatalf("second Load: %v, want no history", err)
			}
		})
	}
}
