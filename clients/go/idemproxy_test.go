package idemproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"go.nanomsg.org/mangos/v3"
	"go.nanomsg.org/mangos/v3/protocol/req"

	pb "github.com/idemproxy/idemproxy/clients/go/idemproxyv1"
)

// peer plays idemproxy: a REQ socket bound to a fresh ipc endpoint.
type peer struct {
	t    *testing.T
	sock mangos.Socket
	url  string
}

func newPeer(t *testing.T) *peer {
	t.Helper()
	sock, err := req.NewSocket()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sock.Close() })
	return &peer{t: t, sock: sock, url: "ipc://" + filepath.Join(t.TempDir(), "px.sock")}
}

func (p *peer) listen() {
	if err := p.sock.Listen(p.url); err != nil {
		p.t.Fatal(err)
	}
}

// request sends raw bytes on a fresh REQ context and returns the decoded Ack.
func (p *peer) request(body []byte) (*pb.Ack, error) {
	c, err := p.sock.OpenContext()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetOption(mangos.OptionRecvDeadline, 5*time.Second)
	if err := c.Send(body); err != nil {
		return nil, err
	}
	out, err := c.Recv()
	if err != nil {
		return nil, err
	}
	var ack pb.Ack
	return &ack, proto.Unmarshal(out, &ack)
}

func (p *peer) deliver(d *pb.Delivery) *pb.Ack {
	p.t.Helper()
	body, err := proto.Marshal(d)
	if err != nil {
		p.t.Fatal(err)
	}
	ack, err := p.request(body)
	if err != nil {
		p.t.Fatalf("delivery %s: %v", d.Key, err)
	}
	return ack
}

// serve runs Serve in the background; the returned function cancels it and
// returns its result.
func serve(t *testing.T, url string, h Handler, opts ...Option) func() error {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, url, h, opts...) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				err = errors.New("Serve did not return after cancel")
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Error(err)
		}
	})
	return stop
}

func TestAnswers(t *testing.T) {
	p := newPeer(t)
	p.listen()
	var mu sync.Mutex
	seen := map[string]*Delivery{}
	serve(t, p.url, func(ctx context.Context, d *Delivery) error {
		mu.Lock()
		seen[d.Key] = d
		mu.Unlock()
		switch d.Key {
		case "retry":
			return errors.New("db down")
		case "drop":
			return Drop("bad order")
		case "wrapped-drop":
			return fmt.Errorf("charge: %w", Drop("card expired"))
		case "panic":
			panic("boom")
		}
		return nil
	})

	cases := []struct {
		key    string
		status pb.Ack_Status
		reason string
	}{
		{"ok", pb.Ack_ACK, ""},
		{"retry", pb.Ack_RETRY, "db down"},
		{"drop", pb.Ack_DROP, "bad order"},
		{"wrapped-drop", pb.Ack_DROP, "charge: card expired"},
		{"panic", pb.Ack_RETRY, "panic: boom"},
	}
	for i, c := range cases {
		id := fmt.Sprintf("1700000000000-%d", i)
		ack := p.deliver(&pb.Delivery{Stream: "orders", EntryId: id, Key: c.key, Attempt: 1})
		if ack.Status != c.status || ack.Reason != c.reason {
			t.Errorf("%s: got %v %q, want %v %q", c.key, ack.Status, ack.Reason, c.status, c.reason)
		}
		if ack.Stream != "orders" || ack.EntryId != id {
			t.Errorf("%s: echo %q %q, want orders %q", c.key, ack.Stream, ack.EntryId, id)
		}
	}

	deadline := uint64(time.Now().Add(time.Minute).UnixMilli())
	p.deliver(&pb.Delivery{
		Stream: "orders", EntryId: "1-1", Key: "typed", Payload: []byte(`{"n":1}`),
		Fields:  []*pb.Field{{Name: "b", Value: []byte("2")}, {Name: "a", Value: []byte{0, 255}}},
		Attempt: 3, FencingToken: 1 << 40, Lock: "account:7", DeadlineUnixMs: deadline,
	})
	mu.Lock()
	d := seen["typed"]
	mu.Unlock()
	if d.Stream != "orders" || d.EntryID != "1-1" || string(d.Payload) != `{"n":1}` ||
		d.Attempt != 3 || d.FencingToken != 1<<40 || d.Lock != "account:7" || d.DeadlineUnixMs != deadline {
		t.Errorf("decoded %+v", d)
	}
	if len(d.Fields) != 2 || d.Fields[0].Name != "b" || d.Fields[1].Name != "a" {
		t.Errorf("fields not in stream order: %+v", d.Fields)
	}
	if v, ok := d.Field("a"); !ok || string(v) != "\x00\xff" {
		t.Errorf("Field(a) = %q, %v", v, ok)
	}
}

func TestUndecodableIsRetried(t *testing.T) {
	p := newPeer(t)
	p.listen()
	called := make(chan struct{}, 1)
	rec := &recorder{}
	serve(t, p.url, func(ctx context.Context, d *Delivery) error { called <- struct{}{}; return nil },
		Logger(slog.New(rec)))
	ack, err := p.request([]byte{0xff, 0xff, 0xff})
	if err != nil {
		t.Fatal(err)
	}
	if ack.Status != pb.Ack_RETRY || ack.Reason == "" {
		t.Errorf("got %v %q, want RETRY with a reason", ack.Status, ack.Reason)
	}
	select {
	case <-called:
		t.Error("the handler saw an undecodable delivery")
	default:
	}
	if rs := rec.all(); len(rs) != 1 || rs[0].Level != slog.LevelError || rs[0].attrs["err"] == "" {
		t.Errorf("logged %+v, want one error record with the decoding error", rs)
	}
}

// recorder is a slog.Handler that keeps every record, its attributes as text.
type recorder struct {
	mu      sync.Mutex
	records []record
}

type record struct {
	Level slog.Level
	Msg   string
	attrs map[string]string
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	out := record{Level: rec.Level, Msg: rec.Message, attrs: map[string]string{}}
	rec.Attrs(func(a slog.Attr) bool { out.attrs[a.Key] = a.Value.String(); return true })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, out)
	return nil
}

func (r *recorder) all() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.records...)
}

// byKey is the records about the delivery with this key.
func (r *recorder) byKey(key string) []record {
	var out []record
	for _, rec := range r.all() {
		if rec.attrs["key"] == key {
			out = append(out, rec)
		}
	}
	return out
}

func TestHandlerFailuresAreLogged(t *testing.T) {
	p := newPeer(t)
	p.listen()
	rec := &recorder{}
	serve(t, p.url, func(ctx context.Context, d *Delivery) error {
		switch d.Key {
		case "retry":
			return errors.New("db down")
		case "drop":
			return Drop("bad order")
		case "panic":
			panic("boom")
		}
		return nil
	}, Logger(slog.New(rec)))
	for i, key := range []string{"ok", "retry", "drop", "panic"} {
		p.deliver(&pb.Delivery{Stream: "orders", EntryId: fmt.Sprintf("1-%d", i), Key: key, Attempt: 2})
	}
	if rs := rec.byKey("ok"); len(rs) != 0 {
		t.Errorf("an ACK was logged: %+v", rs)
	}
	want := []struct {
		key   string
		level slog.Level
		attr  string
		text  string
	}{
		{"retry", slog.LevelWarn, "err", "db down"},
		{"drop", slog.LevelWarn, "err", "bad order"},
		{"panic", slog.LevelError, "panic", "boom"},
	}
	for _, w := range want {
		rs := rec.byKey(w.key)
		if len(rs) != 1 || rs[0].Level != w.level || rs[0].attrs[w.attr] != w.text ||
			rs[0].attrs["stream"] != "orders" || rs[0].attrs["attempt"] != "2" {
			t.Errorf("%s: logged %+v, want one %v record with %s=%q", w.key, rs, w.level, w.attr, w.text)
		}
	}
}

func TestDefaultLoggerIsSlogDefault(t *testing.T) {
	rec := &recorder{}
	old := slog.Default()
	slog.SetDefault(slog.New(rec))
	t.Cleanup(func() { slog.SetDefault(old) })
	p := newPeer(t)
	p.listen()
	serve(t, p.url, func(ctx context.Context, d *Delivery) error { return errors.New("not yet") })
	p.deliver(&pb.Delivery{Stream: "orders", EntryId: "1-1", Key: "k", Attempt: 1})
	if rs := rec.byKey("k"); len(rs) != 1 || rs[0].attrs["err"] != "not yet" {
		t.Errorf("slog.Default() got %+v, want the handler's error", rs)
	}
}

func TestConcurrentHandlers(t *testing.T) {
	const n = 4
	p := newPeer(t)
	p.listen()
	var entered sync.WaitGroup
	entered.Add(n)
	all := make(chan struct{})
	go func() { entered.Wait(); close(all) }()
	serve(t, p.url, func(ctx context.Context, d *Delivery) error {
		entered.Done()
		select { // every handler waits until all n run at once
		case <-all:
			return nil
		case <-time.After(3 * time.Second):
			return errors.New("handlers did not overlap")
		}
	}, Concurrency(n))

	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ack := p.deliver(&pb.Delivery{Stream: "s", EntryId: fmt.Sprint(i), Key: fmt.Sprint("k", i)})
			if ack.Status != pb.Ack_ACK {
				t.Errorf("k%d: %v %q", i, ack.Status, ack.Reason)
			}
		}(i)
	}
	wg.Wait()
}

func TestDialsBeforeBind(t *testing.T) {
	p := newPeer(t)
	serve(t, p.url, func(ctx context.Context, d *Delivery) error { return nil })
	time.Sleep(300 * time.Millisecond) // the worker is dialing a socket that is not there yet
	p.listen()
	if ack := p.deliver(&pb.Delivery{Stream: "s", EntryId: "1-0", Key: "late"}); ack.Status != pb.Ack_ACK {
		t.Errorf("got %v", ack.Status)
	}
}

func TestCancelFinishesDeliveryInHand(t *testing.T) {
	p := newPeer(t)
	p.listen()
	inHandler, release := make(chan struct{}), make(chan struct{})
	var handlerCtxErr error
	stop := serve(t, p.url, func(ctx context.Context, d *Delivery) error {
		close(inHandler)
		<-release
		handlerCtxErr = ctx.Err()
		return nil
	}, Concurrency(2))

	acks := make(chan *pb.Ack, 1)
	go func() { acks <- p.deliver(&pb.Delivery{Stream: "s", EntryId: "1-0", Key: "k"}) }()
	<-inHandler
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	time.Sleep(200 * time.Millisecond)
	select {
	case <-stopped:
		t.Fatal("Serve returned while a handler was running")
	default:
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Errorf("Serve: %v", err)
	}
	if handlerCtxErr != nil {
		t.Errorf("the handler's ctx was cancelled with Serve's: %v", handlerCtxErr)
	}
	select {
	case ack := <-acks:
		if ack.Status != pb.Ack_ACK {
			t.Errorf("got %v", ack.Status)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the delivery in hand was not answered")
	}
}

func TestHandlerContextHasDeadline(t *testing.T) {
	p := newPeer(t)
	p.listen()
	got := make(chan time.Time, 2)
	serve(t, p.url, func(ctx context.Context, d *Delivery) error {
		dl, _ := ctx.Deadline()
		got <- dl
		return nil
	})
	want := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	p.deliver(&pb.Delivery{Key: "k", DeadlineUnixMs: uint64(want.UnixMilli())})
	if dl := <-got; !dl.Equal(want) {
		t.Errorf("deadline %v, want %v", dl, want)
	}
	p.deliver(&pb.Delivery{Key: "k"})
	if dl := <-got; !dl.IsZero() {
		t.Errorf("deadline %v without DeadlineUnixMs", dl)
	}
}

func TestTCP(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p := newPeer(t)
	p.url = "tcp://" + addr
	p.listen()
	serve(t, p.url, func(ctx context.Context, d *Delivery) error { return nil })
	if ack := p.deliver(&pb.Delivery{Stream: "s", EntryId: "1-0", Key: "k"}); ack.Status != pb.Ack_ACK {
		t.Errorf("got %v", ack.Status)
	}
}

func TestBadEndpoint(t *testing.T) {
	err := Serve(context.Background(), "nope://x", func(context.Context, *Delivery) error { return nil })
	if err == nil {
		t.Fatal("Serve accepted an unknown transport")
	}
}

// Issue 33: a worker pointed at a wrong endpoint dialed in silence for ever.
func TestStillDialingIsLoggedUntilConnected(t *testing.T) {
	t.Setenv(DialLogEnv, "300")
	p := newPeer(t)
	rec := &recorder{}
	serve(t, p.url, func(ctx context.Context, d *Delivery) error { return nil }, Logger(slog.New(rec)))
	dialing := func() []record {
		var out []record
		for _, r := range rec.all() {
			if strings.HasPrefix(r.Msg, "idemproxy: still dialing "+p.url+": no connection to idemproxy for ") {
				out = append(out, r)
			}
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(dialing()) < 2 && time.Now().Before(deadline) { // the first, and one 6 x 300 ms later
		time.Sleep(50 * time.Millisecond)
	}
	if rs := dialing(); len(rs) < 2 || rs[0].Level != slog.LevelWarn || rs[0].attrs["endpoint"] != p.url {
		t.Fatalf("got %+v, want two warnings naming %s", rec.all(), p.url)
	}
	p.listen()
	if ack := p.deliver(&pb.Delivery{Stream: "s", EntryId: "1-0", Key: "k"}); ack.Status != pb.Ack_ACK {
		t.Fatalf("got %v", ack.Status)
	}
	n := len(dialing())
	time.Sleep(2500 * time.Millisecond) // connected: quiet
	if len(dialing()) != n {
		t.Errorf("still dialing logged while connected: %+v", dialing()[n:])
	}
}

func TestEndpointWithoutTransportNamesTheForms(t *testing.T) {
	for _, e := range []string{"/tmp/px.sock", "px.sock"} {
		err := Serve(context.Background(), e, func(context.Context, *Delivery) error { return nil })
		if err == nil || !strings.Contains(err.Error(), "expected ipc:///path/to/socket or tcp://host:port") {
			t.Errorf("%s: got %v", e, err)
		}
	}
}

// rawIPC plays idemproxy at the byte level on a unix socket: it accepts a
// worker's connection and swaps SP headers, so a test chooses every frame.
func rawIPC(t *testing.T, l net.Listener) net.Conn {
	t.Helper()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte{0, 'S', 'P', 0, 0, 48, 0, 0}); err != nil { // REQ
		t.Fatal(err)
	}
	hdr := make([]byte, 8)
	if _, err := io.ReadFull(c, hdr); err != nil || hdr[5] != 49 {
		t.Fatalf("worker's SP header %v: %v", hdr, err)
	}
	return c
}

// rawFrame is one ipc frame: the type byte, the length, request id 1 and a Delivery for key.
func rawFrame(t *testing.T, typ byte, key string) []byte {
	body, err := proto.Marshal(&pb.Delivery{Stream: "s", EntryId: "1-0", Key: key, Attempt: 1})
	if err != nil {
		t.Fatal(err)
	}
	msg := append([]byte{0x80, 0, 0, 1}, body...)
	f := append([]byte{typ}, binary.BigEndian.AppendUint64(nil, uint64(len(msg)))...)
	return append(f, msg...)
}

// nanomsg's ipc frames are type 1, a message; any other type is not one:
// the worker hangs up without running the handler, dials again, and serves
// the type-1 frames of the new connection.
func TestIPCFrameOfAnotherTypeIsNotAMessage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raw.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var mu sync.Mutex
	var seen []string
	serve(t, "ipc://"+path, func(_ context.Context, d *Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, d.Key)
		return nil
	})
	c := rawIPC(t, l)
	if _, err := c.Write(rawFrame(t, 2, "type-2")); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 64)); err == nil {
		t.Fatalf("a frame of type 2 was answered (%d bytes) instead of the connection closed", n)
	} else if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the worker did not hang up: %v", err)
	}
	c = rawIPC(t, l) // it dials again
	if _, err := c.Write(rawFrame(t, 1, "type-1")); err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 9)
	if _, err := io.ReadFull(c, head); err != nil || head[0] != 1 {
		t.Fatalf("no answer to a frame of type 1: %v %v", head, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(seen) != "[type-1]" {
		t.Errorf("the handler saw %v, want [type-1]", seen)
	}
}

// Protocol 1.1: RetryAfter is a RETRY whose Ack carries retry_after_ms (field
// 5) in whole ms rounded up, at least 1, at most an hour; a wrapped one counts.
func TestRetryAfter(t *testing.T) {
	p := newPeer(t)
	p.listen()
	serve(t, p.url, func(_ context.Context, d *Delivery) error {
		switch d.Key {
		case "later":
			return RetryAfter(1500 * time.Millisecond)
		case "wrapped":
			return fmt.Errorf("rate limited: %w", RetryAfter(2500*time.Microsecond))
		case "now":
			return RetryAfter(0)
		case "tomorrow":
			return RetryAfter(24 * time.Hour)
		}
		return errors.New("plain")
	})
	for _, c := range []struct {
		key    string
		ms     uint32
		reason string
	}{{"later", 1500, "retry after 1.5s"}, {"wrapped", 3, "rate limited: retry after 2.5ms"},
		{"now", 1, "retry after 0s"}, {"tomorrow", 3600000, "retry after 24h0m0s"}, {"plain", 0, "plain"}} {
		ack := p.deliver(&pb.Delivery{Stream: "s", EntryId: "1-0", Key: c.key, Attempt: 1})
		if ack.Status != pb.Ack_RETRY || ack.RetryAfterMs != c.ms || ack.Reason != c.reason {
			t.Errorf("%s: %v retry_after_ms=%d reason=%q, want RETRY %d %q",
				c.key, ack.Status, ack.RetryAfterMs, ack.Reason, c.ms, c.reason)
		}
	}
}

// Protocol 1.1: the delivery's W3C trace context reaches the handler.
func TestTraceContextReachesHandler(t *testing.T) {
	p := newPeer(t)
	p.listen()
	got := make(chan *Delivery, 1)
	serve(t, p.url, func(_ context.Context, d *Delivery) error { got <- d; return nil })
	tp := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	p.deliver(&pb.Delivery{Stream: "s", EntryId: "1-0", Key: "k", Attempt: 1, Traceparent: tp, Tracestate: "x=1"})
	if d := <-got; d.Traceparent != tp || d.Tracestate != "x=1" {
		t.Errorf("traceparent %q tracestate %q", d.Traceparent, d.Tracestate)
	}
}
