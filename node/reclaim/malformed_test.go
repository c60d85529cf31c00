package reclaim

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/datum-cloud/galactic-node/node/inventory"
)

// malformedObserver records what a pass tells the Observer of malformed
// objects.
type malformedObserver struct{ got []MalformedCount }

func (o *malformedObserver) Malformed(c MalformedCount)    { o.got = append(o.got, c) }
func (o *malformedObserver) PassDone(Report, int)          {}
func (o *malformedObserver) OrphanRowsCleared(string, int) {}

// tenantMalformed is n objects a tenant made that the inventory cannot
// read, half VPCAttachments (VPC 0 is reserved) and half BGPAdvertisements
// (a name of three segments), under long names: what the report must not
// list in full.
func tenantMalformed(n int) []inventory.Object {
	pad := strings.Repeat("x", 200)
	objs := make([]inventory.Object, 0, n)
	for i := range n {
		if i%2 == 0 {
			objs = append(objs, inventory.AttachmentObject("tenant", fmt.Sprintf("broken-%s-%05d", pad, i), "0", "1"))
		} else {
			objs = append(objs, inventory.AdvertisementObject("tenant", fmt.Sprintf("not-an-ad-%s-%05d", pad, i)))
		}
	}
	return objs
}

// A pass reports how many objects were malformed and names a capped sample
// of them, and tells the Observer a count per kind: neither its report
// (kept and served) nor the metrics grow with what tenants make.
func TestMalformedObjectsAreCountedAndSampledNotListed(t *testing.T) {
	for _, n := range []int{0, 1, MaxMalformedSample, 5000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			obs := &malformedObserver{}
			r := New(newFakeLinks(), liveInventory(tenantMalformed(n)...), &fakeRegistry{}, &fakeLocker{}, obs, nil, Config{})
			rep := r.Pass(context.Background(), PassOptions{})
			if rep.Inputs.MalformedObjects != n {
				t.Errorf("malformedObjects %d, want %d", rep.Inputs.MalformedObjects, n)
			}
			if want := min(n, MaxMalformedSample); len(rep.Inputs.MalformedSample) != want {
				t.Errorf("a sample of %d, want %d", len(rep.Inputs.MalformedSample), want)
			}
			for _, s := range rep.Inputs.MalformedSample {
				// Kind namespace/name: what did not parse.
				if !strings.Contains(s, " tenant/") || !strings.Contains(s, ": ") {
					t.Errorf("sample entry %q names no object or no reason", s)
				}
			}
			want := MalformedCount{Attachments: (n + 1) / 2, Advertisements: n / 2}
			if len(obs.got) != 1 || obs.got[0] != want {
				t.Errorf("the observer was told %+v, want once %+v", obs.got, want)
			}
			b, err := json.Marshal(rep)
			if err != nil {
				t.Fatal(err)
			}
			// The sample's 10 entries of ~270 bytes each, the reason and
			// the counts; 5,000 listed names were ~1.2 MB.
			if len(b) > 16<<10 {
				t.Errorf("the report is %d bytes with %d malformed objects, want at most 16 KiB", len(b), n)
			}
		})
	}
}

// The sample is the inventory's first names in its sorted order, so that
// pass after pass names the same objects, whatever order the cluster lists
// them in.
func TestTheMalformedSampleIsStableAcrossPasses(t *testing.T) {
	objs := tenantMalformed(100)
	reversed := make([]inventory.Object, len(objs))
	for i, o := range objs {
		reversed[len(objs)-1-i] = o
	}
	a := New(newFakeLinks(), liveInventory(objs...), &fakeRegistry{}, &fakeLocker{}, nil, nil, Config{}).Pass(context.Background(), PassOptions{})
	b := New(newFakeLinks(), liveInventory(reversed...), &fakeRegistry{}, &fakeLocker{}, nil, nil, Config{}).Pass(context.Background(), PassOptions{})
	if fmt.Sprint(a.Inputs.MalformedSample) != fmt.Sprint(b.Inputs.MalformedSample) {
		t.Fatalf("the sample depends on the listing order:\n%q\n%q", a.Inputs.MalformedSample, b.Inputs.MalformedSample)
	}
}
