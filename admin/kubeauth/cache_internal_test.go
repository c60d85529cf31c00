package kubeauth

import (
	"crypto/sha256"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
)

// TestAFullCacheDropsTheLeastRecentlyUsed fills a cache past its bound: it
// keeps its size, the entry just used stays, and only the least recently
// used goes.
func TestAFullCacheDropsTheLeastRecentlyUsed(t *testing.T) {
	now := time.Now()
	c := newLRU[int](3)
	key := func(i int) [sha256.Size]byte { return sha256.Sum256([]byte{byte(i)}) }
	for i := range 3 {
		c.put(key(i), i, now.Add(time.Minute))
	}
	c.get(key(0), now) // 1 is now the least recently used
	c.put(key(3), 3, now.Add(time.Minute))
	if c.len() != 3 {
		t.Fatalf("%d entries, want 3", c.len())
	}
	for i, want := range []bool{true, false, true, true} {
		if _, ok := c.get(key(i), now); ok != want {
			t.Errorf("entry %d cached %v, want %v", i, ok, want)
		}
	}
	if _, ok := c.get(key(3), now.Add(time.Minute)); ok {
		t.Error("an expired entry was returned")
	}
}

// TestTheAuthorizationKeyIsTheWholeUser: any difference in name, UID,
// groups, extra or verb is another key; the order of groups is not.
func TestTheAuthorizationKeyIsTheWholeUser(t *testing.T) {
	base := authnv1.UserInfo{Username: "alice", UID: "1", Groups: []string{"a", "ops"}, Extra: map[string]authnv1.ExtraValue{"k": {"v"}}}
	same := authnv1.UserInfo{Username: "alice", UID: "1", Groups: []string{"ops", "a"}, Extra: map[string]authnv1.ExtraValue{"k": {"v"}}}
	if authzKey(base, "get") != authzKey(same, "get") {
		t.Error("the order of groups changed the key")
	}
	for name, u := range map[string]authnv1.UserInfo{
		"no groups":   {Username: "alice", UID: "1", Extra: base.Extra},
		"other group": {Username: "alice", UID: "1", Groups: []string{"a"}, Extra: base.Extra},
		"other uid":   {Username: "alice", UID: "2", Groups: base.Groups, Extra: base.Extra},
		"no extra":    {Username: "alice", UID: "1", Groups: base.Groups},
		"other extra": {Username: "alice", UID: "1", Groups: base.Groups, Extra: map[string]authnv1.ExtraValue{"k": {"w"}}},
		"split group": {Username: "alice", UID: "1", Groups: []string{"aops"}, Extra: base.Extra},
		"other name":  {Username: "alice2", UID: "1", Groups: base.Groups, Extra: base.Extra},
	} {
		if authzKey(u, "get") == authzKey(base, "get") {
			t.Errorf("%s: same key as the base user", name)
		}
	}
	if authzKey(base, "get") == authzKey(base, "create") {
		t.Error("the verb does not change the key")
	}
}
