package hub

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The API server's audit log is the history's evidence of the reads a
// collect rests on: the checker lets an identity go under a re-created
// network only when a replica read the name gone before the re-create
// (check.go, RuleIdentityLost). The policy logs only networks' gets,
// lists, creates and deletes, with their responses (a list's revision, a
// create's or delete's UID); nothing else, so the log stays small.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: RequestResponse
  verbs: ["get", "list", "create", "delete"]
  resources:
  - group: networking.datumapis.com
    resources: ["networks"]
- level: None
`

// hubUserAgent begins the user agent of every replica's requests
// (cmd/galactic-hubctl sets it, naming the replica).
const hubUserAgent = "galactic-hubctl/"

// withAudit returns the API server's configuration that writes the audit
// log to dir/audit.log, and that path.
func withAudit(dir string) (func(*envtest.APIServer), string, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, "", err
	}
	path := filepath.Join(dir, "audit.log")
	return func(s *envtest.APIServer) {
		s.Configure().
			Set("audit-policy-file", policy).
			Set("audit-log-path", path).
			Set("audit-log-format", "json").
			Set("audit-log-mode", "blocking").
			// The tail reads one file from its start: the API server
			// (lumberjack) rotates at 100 MB unless told otherwise, and a
			// run of an hour wrote 130 MB, the rest of which the tail
			// never saw (its networks' deletes missing, every later
			// collect judged a live network's). 1 TB: never, here.
			Set("audit-log-maxsize", "1000000")
	}, path, nil
}

// auditEvent is what the harness reads of an audit.k8s.io/v1 Event.
type auditEvent struct {
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	UserAgent  string `json:"userAgent"`
	ObjectRef  *struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	ResponseObject *struct {
		Metadata struct {
			Namespace       string `json:"namespace"`
			Name            string `json:"name"`
			UID             string `json:"uid"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	} `json:"responseObject"`
	Received time.Time `json:"requestReceivedTimestamp"`
	Done     time.Time `json:"stageTimestamp"`
}

// auditTail adds to a history, as KindRead and KindStored events, what the
// audit log gains.
type auditTail struct {
	path string
	hist *History

	mu sync.Mutex
	f  *os.File
	r  *bufio.Reader
	// partial is a line not yet ended.
	partial []byte
	// readTo: every line written before it has been read.
	readTo time.Time
	closed bool
}

func newAuditTail(path string, hist *History) *auditTail {
	return &auditTail{path: path, hist: hist}
}

// run reads the log every 100 ms until ctx ends.
func (a *auditTail) run(ctx context.Context) {
	for {
		a.poll()
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// caughtUp is when the last read to the end of the log began: every read
// the API server answered before it is in the history. Zero until the
// first poll, which runScene makes before any watch starts.
func (a *auditTail) caughtUp() time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.readTo
}

// poll reads the log to its end.
func (a *auditTail) poll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	start := time.Now()
	if a.closed {
		return
	}
	if a.f == nil {
		f, err := os.Open(a.path)
		if errors.Is(err, os.ErrNotExist) {
			a.readTo = start // nothing written yet: nothing unread
			return
		}
		if err != nil {
			a.hist.Add(Event{Kind: KindNote, What: "audit log", Err: err.Error()})
			return
		}
		a.f, a.r = f, bufio.NewReaderSize(f, 1<<20)
	}
	for {
		line, err := a.r.ReadBytes('\n')
		a.partial = append(a.partial, line...)
		if err != nil {
			if !errors.Is(err, io.EOF) {
				a.hist.Add(Event{Kind: KindNote, What: "audit log", Err: err.Error()})
				return
			}
			a.readTo = start
			return
		}
		a.record(a.partial)
		a.partial = a.partial[:0]
	}
}

// close stops reading.
func (a *auditTail) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	if a.f != nil {
		_ = a.f.Close()
		a.f = nil
	}
}

func (a *auditTail) record(line []byte) {
	var ae auditEvent
	if err := json.Unmarshal(line, &ae); err != nil {
		a.hist.Add(Event{Kind: KindNote, What: "audit log", Err: err.Error()})
		return
	}
	if e, ok := auditHistoryEvent(ae); ok {
		a.hist.Add(e)
	}
}

// auditHistoryEvent is what the history keeps of an audit event: a
// replica's get or list past its cache (a list at resourceVersion "", not
// an informer's from its watch cache), or anyone's create or delete.
func auditHistoryEvent(ae auditEvent) (Event, bool) {
	if ae.Stage != "ResponseComplete" || ae.ObjectRef == nil || ae.ResponseStatus == nil {
		return Event{}, false
	}
	e := Event{T: ae.Received, Done: ae.Done, Code: ae.ResponseStatus.Code, What: ae.Verb}
	if ae.ResponseObject != nil {
		e.UID, e.RV = ae.ResponseObject.Metadata.UID, ParseRV(ae.ResponseObject.Metadata.ResourceVersion)
	}
	switch ae.Verb {
	case "get", "list":
		if !strings.HasPrefix(ae.UserAgent, hubUserAgent) {
			return Event{}, false
		}
		e.Kind, e.Replica = KindRead, replicaOf(ae.UserAgent)
		if ae.Verb == "get" {
			e.Network, e.UID = ae.ObjectRef.Namespace+"/"+ae.ObjectRef.Name, ""
			return e, true
		}
		// A list served from a cache (resourceVersion "0", or any other
		// set) may be stale: it confirms nothing.
		if u, err := url.Parse(ae.RequestURI); err != nil || u.Query().Get("resourceVersion") != "" {
			return Event{}, false
		}
		if ae.ObjectRef.Namespace != "" {
			e.Network = ae.ObjectRef.Namespace + "/"
		}
		return e, true
	case "create", "delete":
		if e.Code >= 300 || e.UID == "" {
			return Event{}, false
		}
		e.Kind = KindStored
		e.Network = ae.ObjectRef.Namespace + "/" + ae.ObjectRef.Name
		if ae.ResponseObject != nil && ae.Verb == "create" {
			e.Network = ae.ResponseObject.Metadata.Namespace + "/" + ae.ResponseObject.Metadata.Name
		}
		return e, true
	}
	return Event{}, false
}

// replicaOf is the replica a user agent names: "galactic-hubctl/v (hub-a)".
func replicaOf(ua string) string {
	if i, j := strings.LastIndex(ua, "("), strings.LastIndex(ua, ")"); i >= 0 && j > i {
		return ua[i+1 : j]
	}
	return ""
}
