package admin_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/datum-cloud/galactic-node/admin"
	"github.com/datum-cloud/galactic-node/node/dropwatch"
)

func dropOf(tap string, second int) dropwatch.Record {
	return dropwatch.Record{
		Time: time.Date(2026, 12, 6, 10, 0, second, 0, time.UTC), Tap: tap, Ifindex: 7, VPC: "a", Attachment: "8",
		Decision: "spoofed", Rule: 10, RuleName: "anti-spoofing, IP", Length: 50,
		SrcMAC: "02:00:00:00:00:08", DstMAC: "ff:ff:ff:ff:ff:ff", EtherType: "ipv4",
		SrcIP: "10.99.99.99", DstIP: "10.10.0.1", Protocol: "udp", SrcPort: 40000, DstPort: 53,
	}
}

// feed hands records to the fake node's drop monitor and waits until it
// has read them all.
func feed(t *testing.T, s *server, recs ...dropwatch.Record) {
	t.Helper()
	before := s.backend.drops.Stats().Read
	for _, r := range recs {
		s.backend.dropFeed.c <- r
	}
	for s.backend.drops.Stats().Read < before+uint64(len(recs)) {
		time.Sleep(time.Millisecond)
	}
}

// raw is the body of GET path with the read token.
func raw(t *testing.T, s *server, path string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", s.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+readToken)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func ndjson(t *testing.T, body string) []dropwatch.Record {
	t.Helper()
	var out []dropwatch.Record
	for line := range strings.SplitSeq(strings.TrimSuffix(body, "\n"), "\n") {
		if line == "" {
			continue
		}
		var r dropwatch.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("line %q is not a record: %v", line, err)
		}
		out = append(out, r)
	}
	return out
}

func TestDropsLookBackIsNDJSONOfTheKeptRecords(t *testing.T) {
	s := start(t, admin.Config{})
	feed(t, s, dropOf("tapA", 1), dropOf("tapB", 2), dropOf("tapA", 3))

	resp, body := raw(t, s, "/v1/drops")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != admin.NDJSONType {
		t.Fatalf("GET /v1/drops: %d %s %v", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if got := ndjson(t, body); len(got) != 3 || got[0].Tap != "tapA" || got[2].Time.Second() != 3 || got[0].SrcIP != "10.99.99.99" {
		t.Fatalf("look back: %+v, want the 3 records oldest first", got)
	}
	_, body = raw(t, s, "/v1/drops?tap=tapA&limit=1")
	if got := ndjson(t, body); len(got) != 1 || got[0].Tap != "tapA" || got[0].Time.Second() != 3 {
		t.Fatalf("tap=tapA&limit=1: %+v, want tapA's newest", got)
	}
	resp, text := raw(t, s, "/v1/drops?tap=tapB", "Accept", "text/plain")
	if resp.StatusCode != http.StatusOK || !strings.Contains(text, "tapB spoofed (rule 10, anti-spoofing, IP)") ||
		!strings.Contains(text, "10.99.99.99:40000 > 10.10.0.1:53 udp length 50") || strings.Count(text, "\n") != 1 {
		t.Fatalf("text look back: %d %q", resp.StatusCode, text)
	}
}

func TestDropsRefusesBadQueriesAndSaysWhenThereIsNoMonitor(t *testing.T) {
	s := start(t, admin.Config{})
	for _, q := range []string{"follow=maybe", "limit=-1", "limit=100000", "tap=" + strings.Repeat("x", 16), "tap=a%1bb", "verdict=DROPPED", "tap=a&tap=b"} {
		if resp, body := s.do(t, "GET", "/v1/drops?"+q, readToken, nil); resp.StatusCode != http.StatusBadRequest || body["error"] == nil {
			t.Errorf("GET /v1/drops?%s: %d %v, want 400 with an error", q, resp.StatusCode, body)
		}
	}
	s.backend.noDrops.Store(true)
	if resp, body := s.do(t, "GET", "/v1/drops", readToken, nil); resp.StatusCode != http.StatusServiceUnavailable ||
		!strings.Contains(body["error"].(string), "no drop monitor") {
		t.Fatalf("GET /v1/drops with no monitor: %d %v, want 503 saying so", resp.StatusCode, body)
	}
}

// follow opens ?follow=true for query and returns a reader of its lines
// and the function that hangs up.
func follow(t *testing.T, s *server, query string) (*bufio.Reader, *http.Response, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", s.url+"/v1/drops?follow=true"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+readToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hangUp := func() { cancel(); resp.Body.Close() }
	t.Cleanup(hangUp)
	return bufio.NewReader(resp.Body), resp, hangUp
}

func TestDropsFollowStreamsNewRecordsAndIsBounded(t *testing.T) {
	s := start(t, admin.Config{}) // two followers at most
	feed(t, s, dropOf("tapA", 1))
	lines, resp, hangUp := follow(t, s, "&tap=tapA")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("follow: %d", resp.StatusCode)
	}
	first, err := lines.ReadString('\n')
	if err != nil || ndjson(t, first)[0].Time.Second() != 1 {
		t.Fatalf("follow's look back: %q %v, want the kept record first", first, err)
	}
	feed(t, s, dropOf("tapB", 2), dropOf("tapA", 3))
	next, err := lines.ReadString('\n')
	if err != nil || ndjson(t, next)[0].Tap != "tapA" || ndjson(t, next)[0].Time.Second() != 3 {
		t.Fatalf("follow's next line: %q %v, want tapA's new record (tapB's filtered out)", next, err)
	}

	_, _, _ = follow(t, s, "")
	if resp, body := s.do(t, "GET", "/v1/drops?follow=true", readToken, nil); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a third follower: %d %v, want 429", resp.StatusCode, body)
	}
	// A follower that hangs up frees its place.
	hangUp()
	deadline := time.Now().Add(30 * time.Second)
	for s.backend.drops.Stats().Followers != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("followers after one hung up: %d, want 1", s.backend.drops.Stats().Followers)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
