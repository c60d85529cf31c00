package hub

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// The checker over histories written by hand: each rule caught, and each
// allowed race let through.

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// at stamps events a millisecond apart, in order.
func at(events ...Event) []Event {
	for i := range events {
		events[i].T = t0.Add(time.Duration(i) * time.Millisecond)
	}
	return events
}

func network(what, n, uid string, rv uint64) Event {
	return Event{Kind: KindObserve, Object: ObjectNetwork, What: what, Network: n, UID: uid, RV: rv}
}

func identity(what, n, uid string, fid uint32, rv uint64) Event {
	return Event{Kind: KindObserve, Object: ObjectIdentity, What: what, Network: n, UID: uid, FabricID: fid, RV: rv}
}

func claim(what, name, n, block string, rv uint64) Event {
	return Event{Kind: KindObserve, Object: ObjectClaim, What: what, Claim: name, Network: n, Block: block, RV: rv}
}

// list is a replica's LIST of networks in scope ("" every namespace,
// "ns/" one), served at revision rv.
func list(scope string, rv uint64) Event {
	return Event{Kind: KindRead, What: "list", Network: scope, RV: rv, Code: 200}
}

// get is a replica's GET of network n, received and answered at those
// milliseconds after t0.
func get(n string, code, received, answered int) Event {
	return Event{Kind: KindRead, What: "get", Network: n, Code: code,
		T: t0.Add(time.Duration(received) * time.Millisecond), Done: t0.Add(time.Duration(answered) * time.Millisecond)}
}

// stored is a network's create or delete as the audit log shows it.
func stored(what, n, uid string, received, answered int) Event {
	return Event{Kind: KindStored, What: what, Network: n, UID: uid, Code: 200,
		T: t0.Add(time.Duration(received) * time.Millisecond), Done: t0.Add(time.Duration(answered) * time.Millisecond)}
}

func rules(vs []Violation) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Rule)
	}
	return out
}

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name    string
		history []Event
		want    []string
	}{
		{"a network's life, its identity written and collected after it", at(
			network("added", "a/x", "n1", 10),
			claim("modified", "fabric-identity.a.x", "a/x", "fd00:0:0:7::/64", 11),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			identity("deleted", "a/x", "i1", 7, 21),
		), nil},
		{"an identity deleted under its live network", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			identity("deleted", "a/x", "i1", 7, 15),
		), []string{RuleIdentityLost}},
		{"an identity deleted before its network was", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			identity("deleted", "a/x", "i1", 7, 15),
			network("deleted", "a/x", "n1", 20),
		), []string{RuleIdentityLost}},
		{"the earlier network's identity collected under the re-created one, on a list that found it gone, then written again", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			list("", 20),
			network("added", "a/x", "n2", 21),
			identity("deleted", "a/x", "i1", 7, 22),
			identity("added", "a/x", "i2", 7, 30),
		), nil},
		{"the same, on a list of the network's namespace", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			list("a/", 20),
			network("added", "a/x", "n2", 21),
			identity("deleted", "a/x", "i1", 7, 22),
		), nil},
		{"the earlier network's identity collected under the re-created one with no read that found it gone", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			network("added", "a/x", "n2", 21),
			identity("deleted", "a/x", "i1", 7, 22),
		), []string{RuleIdentityLost}},
		{"a list served after the re-create excuses nothing", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			network("added", "a/x", "n2", 21),
			list("", 21),
			identity("deleted", "a/x", "i1", 7, 40),
		), []string{RuleIdentityLost}},
		{"a list served before the earlier network's deletion excuses nothing", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			list("", 15),
			network("deleted", "a/x", "n1", 20),
			network("added", "a/x", "n2", 21),
			identity("deleted", "a/x", "i1", 7, 22),
		), []string{RuleIdentityLost}},
		{"a list of another namespace excuses nothing", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			list("b/", 20),
			network("added", "a/x", "n2", 21),
			identity("deleted", "a/x", "i1", 7, 22),
		), []string{RuleIdentityLost}},
		{"a get answered 404 before the re-create was answered excuses", append(at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			network("added", "a/x", "n2", 21),
			identity("deleted", "a/x", "i1", 7, 22),
		), stored("delete", "a/x", "n1", 100, 110), get("a/x", 404, 120, 130), stored("create", "a/x", "n2", 125, 140)), nil},
		{"a get begun after the re-create was answered excuses nothing", append(at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			network("added", "a/x", "n2", 21),
			identity("deleted", "a/x", "i1", 7, 22),
		), stored("delete", "a/x", "n1", 100, 110), stored("create", "a/x", "n2", 125, 140), get("a/x", 404, 141, 150)), []string{RuleIdentityLost}},
		{"a get that ended before the deletion began excuses nothing", append(at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			network("added", "a/x", "n2", 21),
			identity("deleted", "a/x", "i1", 7, 22),
		), get("a/x", 404, 80, 90), stored("delete", "a/x", "n1", 100, 110), stored("create", "a/x", "n2", 125, 140)), []string{RuleIdentityLost}},
		{"a get that found the network excuses nothing", append(at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			network("added", "a/x", "n2", 21),
			identity("deleted", "a/x", "i1", 7, 22),
		), stored("delete", "a/x", "n1", 100, 110), get("a/x", 200, 120, 130), stored("create", "a/x", "n2", 125, 140)), []string{RuleIdentityLost}},
		{"an identity the re-created network wrote itself, deleted under it on a read that found the name gone", at(
			network("added", "a/x", "n1", 10),
			network("deleted", "a/x", "n1", 20),
			list("", 20),
			network("added", "a/x", "n2", 21),
			identity("added", "a/x", "i2", 7, 22),
			identity("deleted", "a/x", "i2", 7, 23),
		), []string{RuleIdentityLost}},
		{"a steady network's identity deleted, whatever was read", at(
			network("added", "a/steady", "n1", 10),
			identity("added", "a/steady", "i1", 7, 12),
			list("", 13),
			identity("deleted", "a/steady", "i1", 7, 14),
		), []string{RuleIdentityLost}},
		{"a returning name given another fabric ID", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			network("deleted", "a/x", "n1", 20),
			identity("deleted", "a/x", "i1", 7, 21),
			network("added", "a/x", "n2", 30),
			identity("added", "a/x", "i2", 9, 32),
		), []string{RuleIdentityChanged}},
		{"an identity changed in place", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			identity("modified", "a/x", "i1", 8, 13),
		), []string{RuleIdentityChanged, RuleIdentityChanged}},
		{"a gone network's block bound to another network", at(
			claim("modified", "fabric-identity.a.x", "a/x", "fd00:0:0:7::/64", 11),
			claim("deleted", "fabric-identity.a.x", "a/x", "fd00:0:0:7::/64", 20),
			claim("modified", "fabric-identity.b.y", "b/y", "fd00:0:0:7::/64", 21),
		), []string{RuleBlockShared}},
		{"a claim without annotations named for its network", at(
			claim("modified", "fabric-identity.a.x", "", "fd00:0:0:7::/64", 11),
			identity("added", "b/y", "i1", 7, 12),
		), []string{RuleBlockShared}},
		{"a watch gap hides the network's deletion", at(
			network("added", "a/x", "n1", 10),
			identity("added", "a/x", "i1", 7, 12),
			Event{Kind: KindObserve, Object: ObjectIdentity, What: "deleted", Network: "a/x", UID: "i1", FabricID: 7, RV: 15, Gap: true},
		), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rules(Check(tc.history)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("rules broken: %q, want %q\n%v", got, tc.want, Check(tc.history))
			}
		})
	}
}

func TestCheckSoFarWaitsForTheOtherWatch(t *testing.T) {
	history := at(
		network("added", "a/x", "n1", 10),
		identity("added", "a/x", "i1", 7, 12),
		identity("deleted", "a/x", "i1", 7, 21),
	)
	// The identity's deletion, observed at t0+2ms: the network watch may
	// not have delivered the network's deletion (revision 20) yet.
	if vs := CheckSoFar(history, t0.Add(2*time.Millisecond)); len(vs) != 0 {
		t.Fatalf("judged a deletion too recent to judge: %v", vs)
	}
	if vs := CheckSoFar(history, t0.Add(time.Second)); len(rules(vs)) != 1 {
		t.Fatalf("a deletion old enough went unjudged: %v", vs)
	}
}

func TestCheckSettled(t *testing.T) {
	for _, tc := range []struct {
		name string
		snap Snapshot
		want []string
	}{
		{"gone networks hold only the claims kept under Delete", Snapshot{
			Networks: []string{"a/x"}, Identities: map[string]uint32{"a/x": 1},
			Claims: []SnapClaim{
				{Name: "fabric-identity.a.x", Network: "a/x", Policy: "Retain"},
				{Name: "fabric-identity.a.keep", Network: "a/keep", Policy: "Delete"},
			},
			QuotaLimit: 2, QuotaUsed: 2,
		}, nil},
		{"a gone network holds a Retain claim", Snapshot{
			Identities: map[string]uint32{},
			Claims:     []SnapClaim{{Name: "fabric-identity.a.y", Network: "a/y", Policy: "Retain", Deleting: true}},
			QuotaLimit: 2, QuotaUsed: 1,
		}, []string{RuleGoneHoldsClaim}},
		{"a live network waits with a unit free", Snapshot{
			Networks: []string{"a/x", "a/y"}, Identities: map[string]uint32{"a/x": 1},
			Claims:     []SnapClaim{{Name: "fabric-identity.a.x", Network: "a/x", Policy: "Retain"}},
			QuotaLimit: 2, QuotaUsed: 1,
		}, []string{RuleWaitsWithUnitFree}},
		{"a live network waits for a full quota", Snapshot{
			Networks: []string{"a/x", "a/y"}, Identities: map[string]uint32{"a/x": 1},
			Claims:     []SnapClaim{{Name: "fabric-identity.a.x", Network: "a/x", Policy: "Retain"}},
			QuotaLimit: 1, QuotaUsed: 1,
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := rules(CheckSettled(tc.snap)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("rules broken: %q, want %q", got, tc.want)
			}
			// Check reads the history's last snapshot the same way.
			history := at(Event{Kind: KindSnapshot, Snapshot: &tc.snap})
			if got := rules(Check(history)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Check: rules broken: %q, want %q", got, tc.want)
			}
		})
	}
}

// TestAHistoryReadsBackAsWritten: what the harness keeps when it fails is
// what Check judged.
func TestAHistoryReadsBackAsWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.jsonl")
	h, err := NewHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	written := at(
		network("added", "a/x", "n1", 10),
		identity("added", "a/x", "i1", 7, 12),
		Event{Kind: KindSnapshot, Snapshot: &Snapshot{Networks: []string{"a/x"}, Identities: map[string]uint32{"a/x": 7}, QuotaLimit: 1, QuotaUsed: 1}},
	)
	for _, e := range written {
		h.Add(e)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	read, err := ReadHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(read, written) {
		t.Fatalf("read back:\n%+v\nwant:\n%+v", read, written)
	}
}

// TestAuditEventsTheHistoryKeeps: a replica's reads past its cache and
// anyone's creates and deletes of networks, as the API server logs them;
// not an informer's list, which a cache may serve, nor the harness's reads.
func TestAuditEventsTheHistoryKeeps(t *testing.T) {
	const hub = `"userAgent":"galactic-hubctl/dev (hub-a)"`
	const harness = `"userAgent":"hub.test/v0.0.0 (linux/amd64) kubernetes/$Format"`
	line := func(verb, uri, ua, ns, name string, code int, response string) string {
		return `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"RequestResponse","stage":"ResponseComplete",` +
			`"requestURI":"` + uri + `","verb":"` + verb + `",` + ua + `,` +
			`"objectRef":{"resource":"networks","namespace":"` + ns + `","name":"` + name + `","apiGroup":"networking.datumapis.com","apiVersion":"v1alpha"},` +
			`"responseStatus":{"metadata":{},"code":` + fmt.Sprint(code) + `}` + response + `,` +
			`"requestReceivedTimestamp":"2026-12-07T12:00:00.000100Z","stageTimestamp":"2026-12-07T12:00:00.000900Z"}`
	}
	received, done := t0.Add(100*time.Microsecond), t0.Add(900*time.Microsecond)
	for _, tc := range []struct {
		name string
		line string
		want *Event
	}{
		{"a replica's list past its cache", line("list", "/apis/networking.datumapis.com/v1alpha/networks?limit=500", hub, "", "", 200,
			`,"responseObject":{"kind":"NetworkList","apiVersion":"networking.datumapis.com/v1alpha","metadata":{"resourceVersion":"412"},"items":[]}`),
			&Event{Kind: KindRead, What: "list", Replica: "hub-a", RV: 412, Code: 200, T: received, Done: done}},
		{"a replica's list of one namespace", line("list", "/apis/networking.datumapis.com/v1alpha/namespaces/team-a/networks?limit=500", hub, "team-a", "", 200,
			`,"responseObject":{"metadata":{"resourceVersion":"413"}}`),
			&Event{Kind: KindRead, What: "list", Replica: "hub-a", Network: "team-a/", RV: 413, Code: 200, T: received, Done: done}},
		{"an informer's list", line("list", "/apis/networking.datumapis.com/v1alpha/networks?limit=500&resourceVersion=0", hub, "", "", 200,
			`,"responseObject":{"metadata":{"resourceVersion":"414"}}`), nil},
		{"a replica's get answered 404", line("get", "/apis/networking.datumapis.com/v1alpha/namespaces/team-a/networks/net-1", hub, "team-a", "net-1", 404,
			`,"responseObject":{"kind":"Status","metadata":{},"code":404}`),
			&Event{Kind: KindRead, What: "get", Replica: "hub-a", Network: "team-a/net-1", Code: 404, T: received, Done: done}},
		{"the harness's get", line("get", "/apis/networking.datumapis.com/v1alpha/namespaces/team-a/networks/net-1", harness, "team-a", "net-1", 404, ""), nil},
		{"a create", line("create", "/apis/networking.datumapis.com/v1alpha/namespaces/team-a/networks", harness, "team-a", "", 201,
			`,"responseObject":{"metadata":{"namespace":"team-a","name":"net-1","uid":"u1","resourceVersion":"415"}}`),
			&Event{Kind: KindStored, What: "create", Network: "team-a/net-1", UID: "u1", RV: 415, Code: 201, T: received, Done: done}},
		{"a delete", line("delete", "/apis/networking.datumapis.com/v1alpha/namespaces/team-a/networks/net-1", harness, "team-a", "net-1", 200,
			`,"responseObject":{"metadata":{"namespace":"team-a","name":"net-1","uid":"u1","resourceVersion":"416"}}`),
			&Event{Kind: KindStored, What: "delete", Network: "team-a/net-1", UID: "u1", RV: 416, Code: 200, T: received, Done: done}},
		{"a delete refused", line("delete", "/apis/networking.datumapis.com/v1alpha/namespaces/team-a/networks/net-1", harness, "team-a", "net-1", 404,
			`,"responseObject":{"kind":"Status","code":404}`), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ae auditEvent
			if err := json.Unmarshal([]byte(tc.line), &ae); err != nil {
				t.Fatal(err)
			}
			got, ok := auditHistoryEvent(ae)
			switch {
			case tc.want == nil && ok:
				t.Fatalf("kept %+v, want nothing", got)
			case tc.want != nil && !ok:
				t.Fatalf("kept nothing, want %+v", *tc.want)
			case tc.want != nil && !reflect.DeepEqual(got, *tc.want):
				t.Fatalf("kept %+v\nwant %+v", got, *tc.want)
			}
		})
	}
}
