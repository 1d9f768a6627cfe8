// Package idemproxy is the Go client for idemproxy workers.
//
// idemproxy binds an endpoint with a raw REQ socket and sends one
// idemproxy.v1.Delivery per unique stream entry. A worker connects a REP
// socket (mangos v3) and answers each delivery with an Ack. Serve does all of
// that around a plain function:
//
//	err := idemproxy.Serve(ctx, "ipc:///tmp/idemproxy.sock",
//		func(ctx context.Context, d *idemproxy.Delivery) error {
//			if bad(d.Payload) {
//				return idemproxy.Drop("not an order") // DROP: dead-lettered, never again
//			}
//			return store(ctx, d) // nil: ACK; an error: RETRY, reason err.Error()
//		}, idemproxy.Concurrency(8))
//
// A handler that panics is answered RETRY too, and so is a delivery that does
// not decode (the handler never sees it): a string that is not UTF-8, a known
// field sent with the wrong wire type. Every Ack echoes the delivery's stream
// and entry id.
//
// A delivery's deadline (DeadlineUnixMs) is its ack deadline: an answer after
// it is ignored and the entry is delivered again, attempt + 1. idemproxy paces
// deliveries per worker, so the ack timer measures the handler's own work,
// not a queue in front of it. A delivery that arrives already past its
// deadline is answered RETRY without calling the handler: no stale work runs.
//
// Concurrency(n) opens n mangos contexts on one socket, each an independent
// REP state machine served by its own goroutine, so up to n deliveries are
// handled at once. The handler's ctx carries the delivery's deadline (an
// answer after it is too late: idemproxy retries the entry) but is not
// cancelled when Serve's ctx is: cancelling Serve's ctx stops taking new
// deliveries, lets the handlers in progress finish and answer, and returns nil.
//
// The socket keeps dialing in the background, so a worker may start before
// idemproxy and survives its restarts; a peer that sends no SP header within
// HandshakeTimeout is hung up on. Without a connection for 5 s (the
// environment variable IDEMPROXY_DIAL_LOG_MS, in milliseconds), Serve logs a
// warning that it is still dialing and where, then one every six times as
// long (30 s) until a connection is up: a wrong endpoint shows in the log. Deliveries of up to app.max_entry_bytes
// (DefaultMaxEntryBytes unless raised: see MaxEntryBytes) are received.
//
// The library never prints. A handler's error or panic, a DROP, a delivery
// that does not decode or came too late and an answer that could not be sent
// are logged through log/slog: to slog.Default() unless the Logger option
// names another *slog.Logger. Each record about a delivery carries its
// stream, entry_id, key and attempt.
//
// The wire types are in the package idemproxyv1 (generated from
// proto/idemproxy/v1/idemproxy.proto). Import it rather than generating the
// proto again: protobuf-go panics when one proto file is registered twice.
package idemproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"go.nanomsg.org/mangos/v3"
	"go.nanomsg.org/mangos/v3/protocol/rep"
	_ "go.nanomsg.org/mangos/v3/transport/all" // ipc://, tcp://, ...

	pb "github.com/idemproxy/idemproxy/clients/go/idemproxyv1"
)

// DefaultEndpoint is idemproxy's default app.endpoint.
const DefaultEndpoint = "ipc:///tmp/idemproxy.sock"

// DefaultMaxEntryBytes is idemproxy's default app.max_entry_bytes: the largest
// Delivery it sends.
const DefaultMaxEntryBytes = 1 << 20

// spHeaderBytes is the room left for the SP header in front of a Delivery (up
// to 8 backtrace words; idemproxy sends one): the socket's receive limit
// counts it too.
const spHeaderBytes = 32

// Field is one stream field: a name and its raw value.
type Field struct {
	Name  string
	Value []byte
}

// Delivery is one stream entry handed to the worker.
type Delivery struct {
	Stream         string  // stream key
	EntryID        string  // Redis entry id, "1700000000000-0"
	Key            string  // the rendered dedup key, without prefix
	Fields         []Field // the entry's fields in stream order, minus the payload field
	Payload        []byte  // the payload field's value, or empty
	Attempt        uint32  // 1 on the first delivery
	FencingToken   uint64  // strictly increasing per lock; 0 when fencing is off
	Lock           string  // the lock FencingToken is for: lock_key's rendered text, else the key; empty when fencing is off
	DeadlineUnixMs uint64  // an answer after this is too late
	Traceparent    string  // W3C trace context of idemproxy's delivery span (protocol 1.1), or ""
	Tracestate     string  // the W3C tracestate that goes with it, or ""
}

// Field returns the value of the first field called name.
func (d *Delivery) Field(name string) ([]byte, bool) {
	for _, f := range d.Fields {
		if f.Name == name {
			return f.Value, true
		}
	}
	return nil, false
}

// Deadline is DeadlineUnixMs as a time; ok is false when it is not set.
func (d *Delivery) Deadline() (t time.Time, ok bool) {
	if d.DeadlineUnixMs == 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(int64(d.DeadlineUnixMs)), true
}

// Handler handles one delivery. It returns nil to ACK, an error made by Drop
// (possibly wrapped) to DROP, one made by RetryAfter to RETRY no earlier than
// its duration, and any other error to RETRY after idemproxy's backoff; the
// reason sent is err.Error().
type Handler func(ctx context.Context, d *Delivery) error

// DropError asks idemproxy to dead-letter the delivery instead of retrying it.
type DropError struct{ Reason string }

func (e *DropError) Error() string { return e.Reason }

// Drop returns the error a handler returns to answer DROP with reason.
func Drop(reason string) error { return &DropError{Reason: reason} }

// RetryAfterError asks idemproxy to deliver the entry again after After
// instead of its backoff (protocol 1.1; an older idemproxy ignores it and
// backs off). The attempt counts toward max_deliveries as any RETRY does.
type RetryAfterError struct{ After time.Duration }

func (e *RetryAfterError) Error() string { return "retry after " + e.After.String() }

// maxRetryAfter is idemproxy's cap on retry_after_ms.
const maxRetryAfter = time.Hour

// millis is After as Ack.retry_after_ms: whole ms rounded up, at least 1
// (0 would mean "the backoff"), at most an hour (idemproxy's cap).
func (e *RetryAfterError) millis() uint32 {
	d := min(max(e.After, time.Millisecond), maxRetryAfter)
	return uint32((d + time.Millisecond - 1) / time.Millisecond)
}

// RetryAfter returns the error a handler returns to answer RETRY and have
// the entry delivered again no earlier than d from now (at least 1 ms,
// capped at an hour by idemproxy): a rate limit, a downstream's Retry-After.
// Wrapped (fmt.Errorf("rate limited: %w", idemproxy.RetryAfter(d))) it still
// counts; the reason sent is err.Error().
func RetryAfter(d time.Duration) error { return &RetryAfterError{After: d} }

// Option configures Serve.
type Option func(*options)

type options struct {
	concurrency   int
	maxEntryBytes int
	log           *slog.Logger
}

// Concurrency sets how many deliveries are handled at the same time (default 1).
func Concurrency(n int) Option { return func(o *options) { o.concurrency = max(n, 1) } }

// MaxEntryBytes sets the largest Delivery accepted, in bytes: idemproxy's
// app.max_entry_bytes (default DefaultMaxEntryBytes; raise both together).
// The socket's receive limit is that plus room for the SP header; a bigger
// message drops the connection. 0 or less means no limit.
func MaxEntryBytes(n int) Option { return func(o *options) { o.maxEntryBytes = n } }

// Logger sets where Serve logs a handler's failures and the problems it
// handles by itself (default: slog.Default(), read when Serve starts; nil
// keeps the default).
func Logger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// flushGrace gives the last answers time to leave: mangos has no linger, and
// closing a socket drops what its pipes have not written yet.
const flushGrace = 100 * time.Millisecond

// Serve connects a REP socket to endpoint and calls h for every delivery
// until ctx is cancelled; then it waits for the handlers in progress, sends
// their answers and returns nil. It returns an error only when it cannot
// serve at all (bad endpoint, unknown transport, socket failure).
func Serve(ctx context.Context, endpoint string, h Handler, opts ...Option) error {
	o := options{concurrency: 1, maxEntryBytes: DefaultMaxEntryBytes}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if !strings.HasPrefix(endpoint, "ipc://") && !strings.HasPrefix(endpoint, "tcp://") {
		return fmt.Errorf("idemproxy: bad endpoint %q: expected %s", endpoint, endpointForms)
	}
	sock, err := rep.NewSocket()
	if err != nil {
		return fmt.Errorf("idemproxy: %w", err)
	}
	defer sock.Close()
	watch := newDialWatch(endpoint, o.log)
	sock.SetPipeEventHook(watch.hook)
	limit := 0 // mangos: no limit
	if o.maxEntryBytes > 0 {
		limit = o.maxEntryBytes + spHeaderBytes
	}
	if err := sock.SetOption(mangos.OptionMaxRecvSize, limit); err != nil {
		return fmt.Errorf("idemproxy: max recv size: %w", err)
	}
	// Asynchronous: keep dialing until idemproxy binds, and again after it goes.
	if err := sock.DialOptions(timedEndpoint(endpoint), map[string]interface{}{mangos.OptionDialAsynch: true}); err != nil {
		return fmt.Errorf("idemproxy: dial %s: %w", endpoint, err)
	}
	ctx, stop := context.WithCancel(ctx) // a context that fails stops the others
	defer stop()
	go watch.run(ctx)
	errc := make(chan error, o.concurrency)
	g := &idleGate{idle: map[mangos.Context]bool{}}
	go g.run(ctx)
	for i := 0; i < o.concurrency; i++ {
		c, err := sock.OpenContext()
		if err != nil {
			stop()
			return fmt.Errorf("idemproxy: context: %w", err)
		}
		go func() { errc <- serveContext(ctx, c, h, &o, g) }()
	}
	for i := 0; i < o.concurrency; i++ {
		if e := <-errc; e != nil && err == nil {
			err = e
			stop()
		}
	}
	time.Sleep(flushGrace)
	return err
}

// endpointForms says what Serve takes.
const endpointForms = "ipc:///path/to/socket or tcp://host:port (idemproxy's app.endpoint)"

// DialLogEnv names the environment variable that sets how long Serve waits
// without a connection before it logs that it is still dialing, in
// milliseconds (default 5000); the next records come every six times as long.
const DialLogEnv = "IDEMPROXY_DIAL_LOG_MS"

// dialWatch logs while the socket has no connection (no attached pipe).
type dialWatch struct {
	endpoint string
	log      *slog.Logger
	first    time.Duration
	mu       sync.Mutex
	pipes    map[uint32]bool // attached pipes, by id
	since    time.Time       // no pipe since
	next     time.Time       // the next record, while there is none
}

func newDialWatch(endpoint string, log *slog.Logger) *dialWatch {
	first := 5 * time.Second
	if ms, err := strconv.Atoi(os.Getenv(DialLogEnv)); err == nil && ms > 0 {
		first = time.Duration(ms) * time.Millisecond
	}
	now := time.Now()
	return &dialWatch{endpoint: endpoint, log: log, first: first, pipes: map[uint32]bool{},
		since: now, next: now.Add(first)}
}

func (w *dialWatch) hook(ev mangos.PipeEvent, p mangos.Pipe) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch ev {
	case mangos.PipeEventAttached:
		w.pipes[p.ID()] = true
	case mangos.PipeEventDetached:
		delete(w.pipes, p.ID())
		if len(w.pipes) == 0 {
			w.since = time.Now()
			w.next = w.since.Add(w.first)
		}
	}
}

// run looks twice a second until ctx ends.
func (w *dialWatch) run(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			w.mu.Lock()
			due := len(w.pipes) == 0 && !now.Before(w.next)
			waited := now.Sub(w.since).Round(time.Second)
			if due {
				w.next = now.Add(6 * w.first)
			}
			w.mu.Unlock()
			if due {
				w.log.Warn("idemproxy: still dialing "+w.endpoint+": no connection to idemproxy for "+
					waited.String()+" (is idemproxy running, and is this its app.endpoint?)",
					"endpoint", w.endpoint)
			}
		}
	}
}

// idleGate stops the contexts waiting in Recv once ctx ends, by closing them:
// a receive blocks without a deadline, so an idle worker does not wake up
// (no polling of ctx), and a context busy with a delivery is not closed under
// its handler: it answers, then sees the gate shut and returns.
type idleGate struct {
	mu      sync.Mutex
	stopped bool
	idle    map[mangos.Context]bool
}

func (g *idleGate) run(ctx context.Context) {
	<-ctx.Done()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped = true
	for c := range g.idle {
		_ = c.Close()
	}
}

// enter marks c as receiving; false once the gate is shut.
func (g *idleGate) enter(c mangos.Context) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return false
	}
	g.idle[c] = true
	return true
}

// leave marks c as no longer receiving; true if the gate was shut meanwhile.
func (g *idleGate) leave(c mangos.Context) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.idle, c)
	return g.stopped
}

// serveContext is one REP state machine: receive, handle, answer, until ctx ends.
func serveContext(ctx context.Context, c mangos.Context, h Handler, o *options, g *idleGate) error {
	defer c.Close()
	for g.enter(c) {
		msg, err := c.Recv()
		if stopped := g.leave(c); err != nil {
			if stopped {
				return nil // closed by the gate: Serve was cancelled
			}
			return fmt.Errorf("idemproxy: receive: %w", err)
		}
		ack := answer(ctx, msg, h, o)
		out, err := proto.Marshal(ack)
		if err == nil {
			err = c.Send(out)
		}
		if err != nil {
			o.log.Error("idemproxy: answer not sent; the entry comes again after its ack timeout",
				"stream", ack.Stream, "entry_id", ack.EntryId, "status", ack.Status.String(), "err", err)
		}
	}
	return nil
}

// answer decodes msg, runs h on it and turns the outcome into an Ack.
func answer(ctx context.Context, msg []byte, h Handler, o *options) *pb.Ack {
	var m pb.Delivery
	err := proto.Unmarshal(msg, &m)
	if err == nil {
		err = misTyped(&m)
	}
	if err != nil {
		err = fmt.Errorf("idemproxy: undecodable delivery: %w", err)
		o.log.Error("idemproxy: undecodable delivery, answered RETRY", "bytes", len(msg), "err", err)
		return &pb.Ack{Status: pb.Ack_RETRY, Reason: err.Error()}
	}
	if m.DeadlineUnixMs != 0 && time.Now().UnixMilli() > int64(m.DeadlineUnixMs) {
		o.log.Warn("idemproxy: deadline passed before the handler ran, answered RETRY",
			"stream", m.Stream, "entry_id", m.EntryId, "key", m.Key, "attempt", m.Attempt)
		return &pb.Ack{Status: pb.Ack_RETRY, Reason: "deadline passed before the handler ran",
			Stream: m.Stream, EntryId: m.EntryId}
	}
	d := &Delivery{
		Stream: m.Stream, EntryID: m.EntryId, Key: m.Key, Payload: m.Payload,
		Attempt: m.Attempt, FencingToken: m.FencingToken, Lock: m.Lock, DeadlineUnixMs: m.DeadlineUnixMs,
		Traceparent: m.Traceparent, Tracestate: m.Tracestate,
	}
	for _, f := range m.Fields {
		d.Fields = append(d.Fields, Field{Name: f.Name, Value: f.Value})
	}
	ack := &pb.Ack{Status: pb.Ack_ACK, Stream: d.Stream, EntryId: d.EntryID}
	if err := call(ctx, h, d, o); err != nil {
		var drop *DropError
		var later *RetryAfterError
		ack.Status, ack.Reason = pb.Ack_RETRY, err.Error()
		msg := "idemproxy: handler failed, answered RETRY"
		switch {
		case errors.As(err, &drop):
			ack.Status, msg = pb.Ack_DROP, "idemproxy: handler dropped the delivery, answered DROP"
		case errors.As(err, &later):
			ack.RetryAfterMs = later.millis()
			o.log.Info("idemproxy: handler asked for a later retry, answered RETRY", "stream", d.Stream,
				"entry_id", d.EntryID, "key", d.Key, "attempt", d.Attempt,
				"retry_after_ms", ack.RetryAfterMs, "err", err)
			return ack
		}
		if !errors.As(err, new(panicked)) { // call logged the panic, with its stack
			o.log.Warn(msg, "stream", d.Stream, "entry_id", d.EntryID, "key", d.Key,
				"attempt", d.Attempt, "err", err)
		}
	}
	return ack
}

// misTyped reports a known field that arrived with the wrong wire type:
// protobuf-go keeps such a field among the unknown ones instead of failing,
// which would hand the handler a zero attempt (the other clients refuse it).
func misTyped(m proto.Message) error {
	r := m.ProtoReflect()
	known := r.Descriptor().Fields()
	for b := r.GetUnknown(); len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if f := known.ByNumber(num); f != nil {
			return fmt.Errorf("field %s has wire type %d", f.Name(), typ)
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	var err error
	r.Range(func(f protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if f.Message() != nil && f.IsList() {
			for i := 0; i < v.List().Len() && err == nil; i++ {
				err = misTyped(v.List().Get(i).Message().Interface())
			}
		}
		return err == nil
	})
	return err
}

// panicked is the error of a handler that panicked: RETRY, reason "panic: <value>".
type panicked struct{ value any }

func (p panicked) Error() string { return fmt.Sprintf("panic: %v", p.value) }

// call runs h with a context that has the delivery's deadline but outlives
// Serve's cancellation, and turns a panic into an error (so: RETRY).
func call(ctx context.Context, h Handler, d *Delivery, o *options) (err error) {
	hctx := context.WithoutCancel(ctx)
	if t, ok := d.Deadline(); ok {
		var cancel context.CancelFunc
		hctx, cancel = context.WithDeadline(hctx, t)
		defer cancel()
	}
	defer func() {
		if r := recover(); r != nil {
			err = panicked{r}
			o.log.Error("idemproxy: handler panicked, answered RETRY", "stream", d.Stream,
				"entry_id", d.EntryID, "key", d.Key, "attempt", d.Attempt,
				"panic", fmt.Sprint(r), "stack", string(debug.Stack()))
		}
	}()
	return h(hctx, d)
}
