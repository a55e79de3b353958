package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// QMP is a minimal client of QEMU's machine protocol on a unix socket. It
// is safe for concurrent use. Replies are matched to commands by id; events
// that arrive in between are kept for Events and WaitEvent.
type QMP struct {
	conn    net.Conn
	greet   QMPGreeting
	writeMu sync.Mutex

	mu      sync.Mutex
	nextID  uint64
	pending map[string]chan qmpMessage
	events  []Event
	taken   int           // events[:taken] were consumed by WaitEvent
	evWake  chan struct{} // closed and replaced when an event arrives
	err     error         // why the connection ended, once it did
	closed  chan struct{}
}

// QMPGreeting is the banner QEMU sends on connect.
type QMPGreeting struct {
	QMP struct {
		Version struct {
			QEMU struct {
				Major int `json:"major"`
				Minor int `json:"minor"`
				Micro int `json:"micro"`
			} `json:"qemu"`
			Package string `json:"package"`
		} `json:"version"`
		Capabilities []string `json:"capabilities"`
	} `json:"QMP"`
}

// Event is an asynchronous QMP event, e.g. STOP, RESUME, MIGRATION.
type Event struct {
	Name string
	Data json.RawMessage
	Time time.Time
}

// QMPError is an error reply of QEMU.
type QMPError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *QMPError) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

// ErrQMPClosed is returned for commands on (or waiting when) the connection
// closed.
var ErrQMPClosed = errors.New("qmp: connection closed")

type qmpMessage struct {
	QMP       json.RawMessage `json:"QMP"`
	ID        json.RawMessage `json:"id"`
	Return    json.RawMessage `json:"return"`
	Error     *QMPError       `json:"error"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// DialQMP connects to the QMP socket at path, reads the greeting and leaves
// capabilities negotiation mode (qmp_capabilities). ctx bounds the whole
// handshake; QEMU answers only once its main loop runs, i.e. once the
// machine is set up.
func DialQMP(ctx context.Context, path string) (*QMP, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	dec := json.NewDecoder(conn)
	var greet QMPGreeting
	if err := dec.Decode(&greet); err != nil {
		conn.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("qmp: read greeting on %s: %w", path, err)
	}
	if !stop() {
		conn.Close()
		return nil, fmt.Errorf("qmp: %s: %w", path, ctx.Err())
	}
	q := &QMP{
		conn:    conn,
		greet:   greet,
		pending: map[string]chan qmpMessage{},
		evWake:  make(chan struct{}),
		closed:  make(chan struct{}),
	}
	go q.read(dec)
	if _, err := q.ExecuteContext(ctx, "qmp_capabilities", nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// Greeting is the banner QEMU sent on connect.
func (q *QMP) Greeting() QMPGreeting { return q.greet }

// Close closes the connection; commands waiting for a reply fail.
func (q *QMP) Close() error {
	err := q.conn.Close()
	<-q.closed
	return err
}

// read dispatches what QEMU sends until the connection ends.
func (q *QMP) read(dec *json.Decoder) {
	var err error
	for {
		var m qmpMessage
		if err = dec.Decode(&m); err != nil {
			break
		}
		switch {
		case m.Event != "":
			ev := Event{Name: m.Event, Data: m.Data}
			if m.Timestamp != nil {
				ev.Time = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
			}
			q.mu.Lock()
			q.events = append(q.events, ev)
			if len(q.events) > 1000 { // keep memory bounded
				drop := len(q.events) - 1000
				q.events = q.events[drop:]
				q.taken = max(0, q.taken-drop)
			}
			close(q.evWake)
			q.evWake = make(chan struct{})
			q.mu.Unlock()
		case m.Return != nil || m.Error != nil:
			q.mu.Lock()
			var id string
			if len(m.ID) > 0 {
				_ = json.Unmarshal(m.ID, &id) // not a string id: not one of ours, id stays ""
			}
			ch, ok := q.pending[id]
			if !ok && id == "" && len(q.pending) == 1 {
				// A reply without id (QEMU could not parse the command)
				// belongs to the only command waiting.
				for k, c := range q.pending {
					id, ch, ok = k, c, true
				}
			}
			if ok {
				delete(q.pending, id)
				ch <- m
			}
			q.mu.Unlock()
		}
	}
	q.mu.Lock()
	q.err = fmt.Errorf("%w: %w", ErrQMPClosed, err)
	for id, ch := range q.pending {
		delete(q.pending, id)
		close(ch)
	}
	q.mu.Unlock()
	close(q.closed)
}

// Execute runs the QMP command cmd with args (nil for none, else anything
// that marshals to a JSON object) and returns its "return" value.
func (q *QMP) Execute(cmd string, args any) (json.RawMessage, error) {
	return q.ExecuteContext(context.Background(), cmd, args)
}

// ExecuteContext is Execute, giving up waiting for the reply when ctx ends.
func (q *QMP) ExecuteContext(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	if q.err != nil {
		err := q.err
		q.mu.Unlock()
		return nil, err
	}
	q.nextID++
	id := "kvnet-" + strconv.FormatUint(q.nextID, 10)
	ch := make(chan qmpMessage, 1)
	q.pending[id] = ch
	q.mu.Unlock()

	req := map[string]any{"execute": cmd, "id": id}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		q.forget(id)
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	q.writeMu.Lock()
	_, err = q.conn.Write(append(b, '\n'))
	q.writeMu.Unlock()
	if err != nil {
		q.forget(id)
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	select {
	case m, ok := <-ch:
		if !ok {
			q.mu.Lock()
			err := q.err
			q.mu.Unlock()
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		if m.Error != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, m.Error)
		}
		return m.Return, nil
	case <-ctx.Done():
		q.forget(id)
		return nil, fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

func (q *QMP) forget(id string) {
	q.mu.Lock()
	delete(q.pending, id)
	q.mu.Unlock()
}

// Events returns the events received so far (the last 1000), oldest first.
func (q *QMP) Events() []Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([]Event(nil), q.events...)
}

// WaitEvent returns the oldest event called name that no WaitEvent returned
// yet, waiting for one until ctx ends. Events not called name that come
// before it are passed over for good.
func (q *QMP) WaitEvent(ctx context.Context, name string) (Event, error) {
	for {
		q.mu.Lock()
		for i := q.taken; i < len(q.events); i++ {
			if q.events[i].Name == name {
				q.taken = i + 1
				ev := q.events[i]
				q.mu.Unlock()
				return ev, nil
			}
		}
		wake, err := q.evWake, q.err
		q.mu.Unlock()
		if err != nil {
			return Event{}, fmt.Errorf("qmp: waiting for event %s: %w", name, err)
		}
		select {
		case <-wake:
		case <-q.closed:
		case <-ctx.Done():
			return Event{}, fmt.Errorf("qmp: waiting for event %s: %w", name, ctx.Err())
		}
	}
}

// Status is the answer of query-status.
type Status struct {
	Running bool   `json:"running"`
	Status  string `json:"status"` // e.g. running, paused, inmigrate, postmigrate
}

// QueryStatus runs query-status.
func (q *QMP) QueryStatus() (Status, error) {
	var s Status
	return s, q.query("query-status", &s)
}

// Migrate starts a live migration to uri (e.g. "tcp:10.0.0.2:4444", where
// a QEMU started with that Incoming listens). It returns once the
// migration started; QueryMigrate or WaitMigration follow it.
func (q *QMP) Migrate(uri string) error {
	_, err := q.Execute("migrate", map[string]any{"uri": uri})
	return err
}

// MigrationInfo is the answer of query-migrate. Times are in milliseconds;
// Downtime and TotalTime are set once the migration completed.
type MigrationInfo struct {
	Status             string        `json:"status"` // none, setup, active, completed, failed, cancelled, ...
	TotalTimeMS        int64         `json:"total-time"`
	DowntimeMS         int64         `json:"downtime"`
	ExpectedDowntimeMS int64         `json:"expected-downtime"`
	SetupTimeMS        int64         `json:"setup-time"`
	ErrorDesc          string        `json:"error-desc"`
	RAM                *MigrationRAM `json:"ram"`
	// Raw is the whole answer, for what the fields above leave out.
	Raw map[string]any `json:"-"`
}

// MigrationRAM is the RAM part of MigrationInfo, in bytes.
type MigrationRAM struct {
	Transferred int64 `json:"transferred"`
	Remaining   int64 `json:"remaining"`
	Total       int64 `json:"total"`
	Duplicate   int64 `json:"duplicate"` // pages sent as "all one byte"
	Normal      int64 `json:"normal"`    // pages sent whole
}

// QueryMigrate runs query-migrate.
func (q *QMP) QueryMigrate() (MigrationInfo, error) {
	raw, err := q.Execute("query-migrate", nil)
	if err != nil {
		return MigrationInfo{}, err
	}
	var mi MigrationInfo
	if err := json.Unmarshal(raw, &mi); err != nil {
		return MigrationInfo{}, fmt.Errorf("qmp query-migrate: %w", err)
	}
	_ = json.Unmarshal(raw, &mi.Raw) // raw parsed above
	return mi, nil
}

// WaitMigration polls query-migrate until the migration completed, and
// returns its last answer; a failed or cancelled migration is an error.
func (q *QMP) WaitMigration(ctx context.Context) (MigrationInfo, error) {
	return q.WaitMigrationFunc(ctx, nil)
}

// WaitMigrationFunc is WaitMigration that also passes every answer of
// query-migrate to progress (when not nil), as the migration goes.
func (q *QMP) WaitMigrationFunc(ctx context.Context, progress func(MigrationInfo)) (MigrationInfo, error) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		mi, err := q.QueryMigrate()
		if err != nil {
			return mi, err
		}
		if progress != nil {
			progress(mi)
		}
		switch mi.Status {
		case "completed":
			return mi, nil
		case "failed", "cancelled":
			return mi, fmt.Errorf("migration %s: %s", mi.Status, mi.ErrorDesc)
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return mi, fmt.Errorf("migration %s after waiting: %w", mi.Status, ctx.Err())
		}
	}
}

func (q *QMP) query(cmd string, v any) error {
	raw, err := q.Execute(cmd, nil)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	return nil
}
