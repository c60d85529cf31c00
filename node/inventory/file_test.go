package inventory

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/node/identity"
)

const goodInventory = `# a lab's inventory
apiVersion: cloud.datumapis.com/v1alpha1
kind: VPCAttachment
metadata:
  name: web-0
  namespace: tenant-a
spec:
  anything: kept as galactic wrote it
status:
  vpc: "10"
  vpcAttachment: "13"
  node: node-a
  containerID: 0123456789abcdef0123456789abcdef0123456789ab
  hostInterface: G000000010013H
---
apiVersion: cloud.datumapis.com/v1alpha1
kind: VPCAttachment
metadata: {name: pending, namespace: tenant-a}
status: {}
---
apiVersion: network.datumapis.com/v1alpha1
kind: BGPAdvertisement
metadata:
  name: 3e-42
  namespace: node-b
  annotations:
    galactic.datum.net/netns.0123456789ab: /var/run/netns/cni-1
spec:
  routerRef: {name: node-b}
  addressFamily: ipv4
---
# only a comment
`

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestAFileInventoryCarriesAttachmentsAndAdvertisements(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.yaml")
	write(t, path, goodInventory)
	s := NewFile(path).Snapshot(context.Background())
	if err := s.Healthy(); err != nil {
		t.Fatal(err)
	}
	if s.Attachments != 1 || s.Advertisements != 1 {
		t.Fatalf("attachments %d advertisements %d, want 1 and 1 (a pending attachment carries none)", s.Attachments, s.Advertisements)
	}
	for _, id := range []identity.Identity{{VPC: 62, Attachment: 65}, {VPC: 62, Attachment: 66}} {
		if !s.Carried(id) {
			t.Errorf("%v not carried", id)
		}
	}
	if refs := s.Carriers(identity.Identity{VPC: 62, Attachment: 65}); len(refs) != 1 || refs[0].String() != "VPCAttachment tenant-a/web-0" {
		t.Errorf("carriers = %v", refs)
	}
}

func TestAFileIsReadAgainWhenItChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.yaml")
	write(t, path, goodInventory)
	f := NewFile(path)
	f.Snapshot(context.Background())
	replaced := strings.Replace(goodInventory, `vpcAttachment: "13"`, `vpcAttachment: "14"`, 1)
	write(t, path+".new", replaced)
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	s := f.Snapshot(context.Background())
	if s.Carried(identity.Identity{VPC: 62, Attachment: 65}) || !s.Carried(identity.Identity{VPC: 62, Attachment: 66}) {
		t.Fatal("the file was not read again after it changed")
	}
	// Same size, rewritten in place: the modification time tells.
	time.Sleep(10 * time.Millisecond)
	write(t, path, strings.Replace(replaced, `vpcAttachment: "14"`, `vpcAttachment: "15"`, 1))
	if s := f.Snapshot(context.Background()); !s.Carried(identity.Identity{VPC: 62, Attachment: 67}) {
		t.Fatal("an in-place rewrite was not read")
	}
}

func TestABadDocumentMakesTheInventoryUnhealthyNamingIt(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct{ data, want string }{
		"another kind":   {goodInventory + "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: x}\n", "document 5 (v1 Pod x/p)"},
		"does not parse": {goodInventory + "---\nkind: [unclosed\n", "document 5"},
		"no name":        {"apiVersion: cloud.datumapis.com/v1alpha1\nkind: VPCAttachment\nmetadata: {namespace: x}\n", "document 1"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		write(t, path, tc.data)
		s := NewFile(path).Snapshot(context.Background())
		if err := s.Healthy(); err == nil || !strings.Contains(err.Error(), tc.want) || s.Identities() != 0 {
			t.Errorf("%s: Healthy() = %v, %d identities; want an error naming %q and nothing carried", name, err, s.Identities(), tc.want)
		}
	}
	if err := NewFile(filepath.Join(dir, "missing")).Snapshot(context.Background()); err.Healthy() == nil {
		t.Error("a missing file reads healthy")
	}
}

func TestMalformedIdentitiesAreReportedAndCarryNothing(t *testing.T) {
	s := (&Static{Synced: true, Objects: []Object{
		AttachmentObject("a", "bad", "not-base62!", "1"),
		AttachmentObject("a", "good", "1", "1"),
		AdvertisementObject("b", "no-dash-here-x"),
	}}).Snapshot(context.Background())
	if s.Malformed() != 2 || s.Attachments != 1 || s.Identities() != 1 {
		t.Fatalf("malformed %d, attachments %d, identities %d", s.Malformed(), s.Attachments, s.Identities())
	}
	if err := s.Healthy(); err != nil {
		t.Fatalf("Healthy() = %v: malformed objects must not halt every removal", err)
	}
}
