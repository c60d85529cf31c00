package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/datum-cloud/galactic-node/test/framework/nettest"
)

// strayTemp puts a file where writeRecord's os.CreateTemp puts a record
// before renaming it, named as CreateTemp names it: ".tmp-<tap>-" and a
// decimal random number. A plugin SIGKILLed between the CreateTemp and the
// Rename leaves exactly this file, empty or holding the record, and no
// process holding it: node/cnitap's
// TestTheCollectionRemovesATempFileOfAKilledWriter kills a real writer
// there, which the built plugin, without test hooks, cannot be made to do.
func strayTemp(t *testing.T, dir, tap string) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, fmt.Sprintf(".tmp-%s-%d", tap, rand.Uint32()))
	if err := os.WriteFile(p, []byte(`{"tap":"`+tap+`"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// assertRecordNamesHostNS checks that ADD's record names the namespace the
// tap was made in, as readlink of /proc/self/ns/net there names it: the
// daemon's collection judges the record only from that namespace.
func assertRecordNamesHostNS(t *testing.T, h *cniHost, path string) {
	t.Helper()
	fi, err := h.host.File.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		HostNetNS string `json:"hostNetns"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("net:[%d]", nettest.Inode(fi)); r.HostNetNS != want {
		t.Fatalf("ADD's record names namespace %q, want %q: %s", r.HostNetNS, want, b)
	}
}

func mustBeGone(t *testing.T, what, path string) {
	t.Helper()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s left the killed writer's temp file %s (%v)", what, path, err)
	}
}

// Every reader skips a dead writer's temp file, so only the commands that
// hold its tap's VPC lock, under which no writer is alive, can remove it:
// the next ADD and DEL of the tap, and GC of its network.
func TestTempFilesOfKilledWritersGoWithTheNextAddDelAndGC(t *testing.T) {
	h := newCNIHost(t)
	dir := filepath.Join(h.dataDir, "galactic")

	tmp := strayTemp(t, dir, tapName("1"))
	h.mustCNI("ADD", ctrA, h.conf("1", nil))
	mustBeGone(t, "ADD", tmp)
	assertRecordNamesHostNS(t, h, filepath.Join(dir, tapName("1")))

	tmp = strayTemp(t, dir, tapName("1"))
	h.mustCNI("DEL", ctrA, h.conf("1", nil))
	mustBeGone(t, "DEL", tmp)

	// An ADD killed before its first record: no tap, no record, only the
	// temp file, which only its network's GC still looks at.
	tmp = strayTemp(t, dir, tapName("2"))
	h.mustCNI("GC", "", h.conf("", map[string]any{"vpc": "", "vpcAttachment": "",
		"cni.dev/valid-attachments": []map[string]string{}}))
	mustBeGone(t, "GC", tmp)
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Fatalf("left in the network's folder: %v", left)
	}
}
