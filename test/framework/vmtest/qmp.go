package vmtest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// qmpTimeout bounds one QMP exchange. QMP answers in milliseconds; the bound
// is for a QEMU that has hung, on a machine that may be loaded.
const qmpTimeout = 60 * time.Second

// QMP is a client of QEMU's machine protocol on its unix socket, negotiated
// (qmp_capabilities) and ready for commands. Commands run one at a time: QMP
// answers them in order, and asynchronous events that arrive in between are
// kept for WaitEvent.
type QMP struct {
	mu      sync.Mutex
	conn    *net.UnixConn
	r       *bufio.Reader
	partial []byte  // a line cut short by a read deadline
	events  []Event // received, not yet taken by WaitEvent
	nextID  int
}

// Event is an asynchronous QMP message: DEVICE_DELETED, SHUTDOWN, ...
type Event struct {
	Name string          `json:"event"`
	Data json.RawMessage `json:"data"`
}

// message is any line QEMU sends: the greeting, a command's return or
// error, or an event.
type message struct {
	QMP    json.RawMessage `json:"QMP"`
	Event  string          `json:"event"`
	Data   json.RawMessage `json:"data"`
	ID     *int            `json:"id"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
}

// dialQMP connects to the QMP socket at path, reads the greeting and
// negotiates capabilities; until then QEMU accepts no other command.
func dialQMP(path string) (*QMP, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("dial QMP %s: %w", path, err)
	}
	q := &QMP{conn: c, r: bufio.NewReader(c)}
	if err := q.conn.SetReadDeadline(time.Now().Add(qmpTimeout)); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	m, err := q.read()
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("QMP greeting: %w", err)
	}
	if m.QMP == nil {
		_ = c.Close()
		return nil, fmt.Errorf("QMP greeting: got %+v, not a greeting", m)
	}
	if _, err := q.Execute("qmp_capabilities", nil); err != nil {
		_ = c.Close()
		return nil, err
	}
	return q, nil
}

// Close closes the connection; QEMU keeps running.
func (q *QMP) Close() error { return q.conn.Close() }

// Execute runs cmd with args (nil for none; anything encoding/json turns into
// an object) and returns its "return" value. A QMP error comes back as an
// error that carries QMP's class and "desc".
func (q *QMP) Execute(cmd string, args any) (json.RawMessage, error) {
	return q.execute(cmd, args, nil)
}

// GetFD hands f to QEMU under name, as libvirt does: the `getfd` command and
// the descriptor (SCM_RIGHTS) travel in the same message, which is how QEMU
// ties one to the other. QEMU keeps its own copy: the caller may close f once
// GetFD returns, and refer to name afterwards (netdev_add type=tap fd=NAME).
func (q *QMP) GetFD(name string, f *os.File) error {
	_, err := q.execute("getfd", map[string]string{"fdname": name}, f)
	return err
}

// execute sends one command, with f's descriptor attached when f is not nil,
// and reads until its answer, keeping events and dropping stale answers
// (of a command that timed out earlier) on the way.
func (q *QMP) execute(cmd string, args any, f *os.File) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nextID++
	id := q.nextID
	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        int    `json:"id"`
	}{cmd, args, id}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("QMP %s: encode arguments: %w", cmd, err)
	}
	deadline := time.Now().Add(qmpTimeout)
	if err := q.conn.SetDeadline(deadline); err != nil {
		return nil, fmt.Errorf("QMP %s: %w", cmd, err)
	}
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	_, _, err = q.conn.WriteMsgUnix(append(b, '\n'), oob, nil)
	runtime.KeepAlive(f)
	if err != nil {
		return nil, fmt.Errorf("QMP %s: send: %w", cmd, err)
	}
	for {
		m, err := q.read()
		if err != nil {
			return nil, fmt.Errorf("QMP %s: %w", cmd, err)
		}
		switch {
		case m.Event != "":
			q.events = append(q.events, Event{Name: m.Event, Data: m.Data})
		case m.ID == nil || *m.ID != id:
			// The answer to an earlier command that timed out.
		case m.Error != nil:
			return nil, fmt.Errorf("QMP %s: %s: %s", cmd, m.Error.Class, m.Error.Desc)
		default:
			return m.Return, nil
		}
	}
}

// WaitEvent returns the data of the first event called name, for which
// match (nil: any) returns true, that no earlier wait has taken, waiting up
// to timeout for it to arrive. Events that do not match stay for later waits.
func (q *QMP) WaitEvent(name string, match func(data json.RawMessage) bool, timeout time.Duration) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	take := func() (json.RawMessage, bool) {
		for i, e := range q.events {
			if e.Name == name && (match == nil || match(e.Data)) {
				q.events = append(q.events[:i], q.events[i+1:]...)
				return e.Data, true
			}
		}
		return nil, false
	}
	if data, ok := take(); ok {
		return data, nil
	}
	if err := q.conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("wait for QMP event %s: %w", name, err)
	}
	for {
		m, err := q.read()
		if err != nil {
			return nil, fmt.Errorf("wait for QMP event %s: %w", name, err)
		}
		if m.Event != "" {
			q.events = append(q.events, Event{Name: m.Event, Data: m.Data})
			if data, ok := take(); ok {
				return data, nil
			}
		}
	}
}

// WaitDeviceDeleted waits up to timeout for QEMU to confirm that the device
// with qdev id is gone (DEVICE_DELETED naming it; QEMU also sends one for
// the device's backend, by path only). After device_del, that takes a guest
// that ejects the device: a paused guest-less VM never does.
func (q *QMP) WaitDeviceDeleted(id string, timeout time.Duration) error {
	_, err := q.WaitEvent("DEVICE_DELETED", func(data json.RawMessage) bool {
		var d struct {
			Device string `json:"device"`
		}
		return json.Unmarshal(data, &d) == nil && d.Device == id
	}, timeout)
	if err != nil {
		return fmt.Errorf("device %s: %w", id, err)
	}
	return nil
}

// read returns the next message. A line cut short by the read deadline is
// kept, so that the next read resumes it instead of parsing half a message.
func (q *QMP) read() (message, error) {
	line, err := q.r.ReadBytes('\n')
	q.partial = append(q.partial, line...)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return message{}, fmt.Errorf("no answer: %w", err)
		}
		return message{}, fmt.Errorf("read: %w", err)
	}
	line, q.partial = bytes.TrimSpace(q.partial), nil
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		return message{}, fmt.Errorf("decode %q: %w", line, err)
	}
	return m, nil
}
