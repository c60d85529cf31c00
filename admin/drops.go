package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/datum-cloud/galactic-node/node/dropwatch"
)

// Bounds of GET /v1/drops. A look back returns at most the records the
// node keeps (dropwatch.DefaultKeep). A live feed (?follow=true) holds a
// connection, so it is bounded three ways: the node's followers
// (dropwatch.DefaultMaxFollowers; 429 beyond), its life (DropFollowMax;
// the client asks again), and each write (DropWriteTimeout: a client that
// stops reading is dropped, never waited for).
const (
	DropFollowMax    = time.Hour
	DropWriteTimeout = 10 * time.Second
	// maxTapName is IFNAMSIZ less its NUL: no longer name is a tap's.
	maxTapName = 15
)

// NDJSONType is the media type of GET /v1/drops: one JSON record per line,
// as `hubble observe -o jsonpb` and `kubectl get -w -o json` stream them.
const NDJSONType = "application/x-ndjson"

// drops serves GET /v1/drops[?tap=NAME][&limit=N][&follow=true]: the
// newest kept records of dropped frames, oldest first, then, with follow,
// each new one as it is read, until the client goes or DropFollowMax
// passes. Each record is one line: JSON (the default), or the text line
// WriteDrop writes for Accept: text/plain.
func (h *handler) drops(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := dropwatch.Filter{Tap: q.Get("tap")}
	if len(f.Tap) > maxTapName || strings.ContainsFunc(f.Tap, unsafeRune) {
		writeError(w, r, http.StatusBadRequest, fmt.Sprintf("tap %q: not an interface name (at most %d printable bytes)", f.Tap, maxTapName))
		return
	}
	follow := false
	if v := q.Get("follow"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			writeError(w, r, http.StatusBadRequest, fmt.Sprintf("follow %q: want true or false", v))
			return
		}
		follow = b
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > dropwatch.DefaultKeep {
			writeError(w, r, http.StatusBadRequest, fmt.Sprintf("limit %q: want a number of records from 0 to %d (0: every kept one)", v, dropwatch.DefaultKeep))
			return
		}
		f.Limit = n
	}
	// The feed starts before the look back is read, so that no record
	// falls between them; one in both is written once.
	var feed *dropwatch.Follower
	if follow {
		var err error
		if feed, err = h.b.Drops.FollowDrops(f); err != nil {
			status := http.StatusServiceUnavailable
			if errors.Is(err, dropwatch.ErrTooManyFollowers) {
				status = http.StatusTooManyRequests
			}
			writeError(w, r, status, err.Error())
			return
		}
		defer feed.Close()
	}
	recent, err := h.b.Drops.RecentDrops(f)
	if err != nil {
		writeError(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	text := wantsText(r)
	if text {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	} else {
		w.Header().Set("Content-Type", NDJSONType)
	}
	rc := http.NewResponseController(w)
	write := func(rec dropwatch.Record) error {
		var line bytes.Buffer
		if text {
			WriteDrop(&line, rec)
		} else {
			b, _ := json.Marshal(withEmptyLists(rec))
			line.Write(escapeJSON(b))
			line.WriteByte('\n')
		}
		_ = rc.SetWriteDeadline(time.Now().Add(DropWriteTimeout))
		_, err := w.Write(line.Bytes())
		return err
	}
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil && follow {
		h.log.Warn("drops: cannot stream to this connection", "error", err)
		return
	}
	var last time.Time
	for _, rec := range recent {
		if err := write(rec); err != nil {
			return
		}
		last = rec.Time
	}
	if !follow {
		return
	}
	// The server's read deadline would end the request's context while
	// it streams; with none, a client that goes still ends it (EOF).
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.Flush()
	end := time.NewTimer(DropFollowMax)
	defer end.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			return
		case rec, ok := <-feed.Records():
			if !ok {
				return // the node stops
			}
			if !rec.Time.After(last) && rec.MissedBefore == 0 && inRecent(recent, rec) {
				continue
			}
			if write(rec) != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

func inRecent(recent []dropwatch.Record, rec dropwatch.Record) bool {
	for i := len(recent) - 1; i >= 0 && !recent[i].Time.Before(rec.Time); i-- {
		if recent[i] == rec {
			return true
		}
	}
	return false
}

// WriteDrop writes rec as one line of text, as a terminal shows it:
//
//	10:31:02.123 tapXXXX spoofed (rule 10, anti-spoofing, IP) 02:00:00:00:00:08 > ff:ff:ff:ff:ff:ff 10.99.99.99:40000 > 10.10.0.1:53 udp length 50
func WriteDrop(w io.Writer, rec dropwatch.Record) {
	if rec.MissedBefore > 0 {
		fmt.Fprintf(w, "(%d records missed here: read too slowly)\n", rec.MissedBefore)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s (rule %d, %s)", rec.Time.Format("2006-01-02T15:04:05.000Z07:00"), dash(rec.Tap), rec.Decision, rec.Rule, rec.RuleName)
	if rec.VPC != "" {
		fmt.Fprintf(&b, " vpc %s att %s", rec.VPC, rec.Attachment)
	}
	if rec.SrcMAC != "" {
		fmt.Fprintf(&b, " %s > %s", rec.SrcMAC, rec.DstMAC)
	}
	if rec.EtherType != "" {
		fmt.Fprintf(&b, " %s", rec.EtherType)
	}
	if rec.SrcIP != "" {
		fmt.Fprintf(&b, " %s > %s", hostPort(rec.SrcIP, rec.SrcPort), hostPort(rec.DstIP, rec.DstPort))
	}
	if rec.Protocol != "" {
		fmt.Fprintf(&b, " %s", rec.Protocol)
	}
	if rec.ICMPType != nil {
		fmt.Fprintf(&b, " type %d", *rec.ICMPType)
		if rec.ICMPCode != nil {
			fmt.Fprintf(&b, " code %d", *rec.ICMPCode)
		}
	}
	fmt.Fprintf(&b, " length %d", rec.Length)
	_, _ = io.WriteString(w, escapeText(b.String())+"\n")
}

func hostPort(ip string, port uint16) string {
	if port == 0 {
		return ip
	}
	if strings.Contains(ip, ":") {
		return "[" + ip + "]:" + strconv.Itoa(int(port))
	}
	return ip + ":" + strconv.Itoa(int(port))
}
