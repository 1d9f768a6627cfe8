// Command example is an idemproxy worker built on the idemproxy package.
//
// It connects to idemproxy (which may start later: the socket keeps dialing),
// answers every delivery and prints one line per delivery on stdout,
// "<key> attempt=<n>", when its handler returns. Everything else goes to
// stderr. SIGTERM or SIGINT: the deliveries in hand are finished and
// answered, then it exits 0.
//
// The environment turns it into a test double (the same contract as
// clients/c/example_worker.c; tests/integration/test_clients.py relies on it):
//
//	IDEMPROXY_ENDPOINT   endpoint when --endpoint is not given
//	WORKER_CONCURRENCY   handle up to n deliveries at the same time (1)
//	WORKER_DELAY_MS      work this long before answering each delivery
//	WORKER_RETRY_KEYS    k1,k2: answer RETRY while attempt <= WORKER_RETRY_TIMES (1)
//	WORKER_RETRY_AFTER_MS  n > 0: those RETRYs ask to come again after n ms
//	                     (idemproxy.RetryAfter) instead of idemproxy's backoff
//	WORKER_DROP_KEYS     k3: answer DROP, reason "dropped by worker"
//	WORKER_NOACK_KEYS    k4: never answer in time (the handler waits out the
//	                     delivery's deadline, so idemproxy's ack timeout fires)
//	WORKER_CRASH_KEYS    k5: exit(3) on receipt, unanswered, as a crash would
//	WORKER_MAX_BYTES     app.max_entry_bytes, if it was raised (-1: no limit)
//	WORKER_VERBOSE=1     describe each delivery on stderr
//	WORKER_SLOW_KEYS     k6: work WORKER_SLOW_MS (1000) on these before answering
//	WORKER_DEADLINE_KEYS k7: work WORKER_SLOW_MS on these, but stop when ctx is
//	                     done (the delivery's deadline) and answer RETRY
//	WORKER_REPORT        a file: one JSON object per answered delivery is appended
//	                     (key, stream, entry_id, attempt, fencing_token,
//	                     deadline_unix_ms, payload, fields, status, start_ms, end_ms,
//	                     traceparent, tracestate, span_trace_id, span_parent_id,
//	                     remaining_ms: the time left by ctx.Deadline() at the start,
//	                     -1 without one; stopped: "signal" when ctx ended the work)
//
// With WORKER_REPORT the handler runs in idemproxyotel's span from an
// OpenTelemetry SDK provider (no exporter): the report gives that span's
// trace id and parent span id, so a test can follow the trace into it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	idemproxy "github.com/idemproxy/idemproxy/clients/go"
	idemproxyotel "github.com/idemproxy/idemproxy/clients/go/otel"
)

// inList reports whether key is one of the comma-separated names in list.
func inList(list, key string) bool {
	for _, k := range strings.Split(list, ",") {
		if k != "" && k == key {
			return true
		}
	}
	return false
}

func envInt(name string, dflt int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return n
	}
	return dflt
}

// reportRow is one line of WORKER_REPORT.
type reportRow struct {
	Key            string            `json:"key"`
	Stream         string            `json:"stream"`
	EntryID        string            `json:"entry_id"`
	Attempt        uint32            `json:"attempt"`
	FencingToken   uint64            `json:"fencing_token"`
	DeadlineUnixMs uint64            `json:"deadline_unix_ms"`
	Payload        string            `json:"payload"`
	Fields         map[string]string `json:"fields"`
	Status         string            `json:"status"`
	StartMs        int64             `json:"start_ms"`
	EndMs          int64             `json:"end_ms"`
	Traceparent    string            `json:"traceparent"`
	Tracestate     string            `json:"tracestate"`
	SpanTraceID    string            `json:"span_trace_id"`
	SpanParentID   string            `json:"span_parent_id"`
	RemainingMs    int64             `json:"remaining_ms"`
	Stopped        string            `json:"stopped"`
}

// spanIDs are the trace id and parent span id of the handler's span, or "".
func spanIDs(ctx context.Context) (traceID, parentID string) {
	span, ok := trace.SpanFromContext(ctx).(sdktrace.ReadOnlySpan)
	if !ok {
		return "", ""
	}
	if p := span.Parent(); p.IsValid() {
		parentID = p.SpanID().String()
	}
	return span.SpanContext().TraceID().String(), parentID
}

func newRow(d *idemproxy.Delivery, status string, start, end time.Time) reportRow {
	row := reportRow{
		Key: d.Key, Stream: d.Stream, EntryID: d.EntryID, Attempt: d.Attempt,
		FencingToken: d.FencingToken, DeadlineUnixMs: d.DeadlineUnixMs,
		Payload: string(d.Payload), Fields: map[string]string{}, Status: status,
		StartMs: start.UnixMilli(), EndMs: end.UnixMilli(),
		Traceparent: d.Traceparent, Tracestate: d.Tracestate, RemainingMs: -1,
	}
	for _, f := range d.Fields {
		row.Fields[f.Name] = string(f.Value)
	}
	return row
}

var outMu sync.Mutex // one writer at a time on stdout and the report

// appendReport appends row to the file named by path, as one write.
func appendReport(path string, row reportRow) error {
	line, err := json.Marshal(row)
	if err != nil {
		return err
	}
	outMu.Lock()
	defer outMu.Unlock()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(append(line, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func printLine(d *idemproxy.Delivery) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintf(os.Stdout, "%s attempt=%d\n", d.Key, d.Attempt) // os.Stdout is unbuffered
}

func describe(d *idemproxy.Delivery) {
	log.Printf("delivery %s %s key=%s attempt=%d fencing=%d deadline=%d",
		d.Stream, d.EntryID, d.Key, d.Attempt, d.FencingToken, d.DeadlineUnixMs)
	for _, f := range d.Fields {
		log.Printf("  %s = %s", f.Name, f.Value)
	}
	log.Printf("  payload = %s", d.Payload)
}

// handle is the worker: the environment decides what it answers, and it says
// so the library's way (nil, an error, idemproxy.Drop).
func handle(ctx context.Context, d *idemproxy.Delivery) error {
	if os.Getenv("WORKER_VERBOSE") == "1" {
		describe(d)
	}
	if inList(os.Getenv("WORKER_CRASH_KEYS"), d.Key) {
		log.Printf("crashing on %s as asked", d.Key)
		os.Exit(3)
	}
	if inList(os.Getenv("WORKER_NOACK_KEYS"), d.Key) {
		printLine(d)
		<-ctx.Done() // the delivery's deadline: any answer is too late now
		return errors.New("not answered in time, as asked")
	}
	start, remaining, stopped := time.Now(), int64(-1), ""
	if t, ok := ctx.Deadline(); ok {
		remaining = time.Until(t).Milliseconds()
	}
	time.Sleep(time.Duration(envInt("WORKER_DELAY_MS", 0)) * time.Millisecond)
	if inList(os.Getenv("WORKER_SLOW_KEYS"), d.Key) {
		time.Sleep(time.Duration(envInt("WORKER_SLOW_MS", 1000)) * time.Millisecond)
	}
	status, err := "ack", error(nil)
	if inList(os.Getenv("WORKER_DEADLINE_KEYS"), d.Key) {
		select {
		case <-time.After(time.Duration(envInt("WORKER_SLOW_MS", 1000)) * time.Millisecond):
		case <-ctx.Done(): // the delivery's deadline
			status, stopped, err = "retry", "signal", ctx.Err()
		}
	}
	switch {
	case err != nil:
	case inList(os.Getenv("WORKER_DROP_KEYS"), d.Key):
		status, err = "drop", idemproxy.Drop("dropped by worker")
	case inList(os.Getenv("WORKER_RETRY_KEYS"), d.Key) &&
		int64(d.Attempt) <= int64(envInt("WORKER_RETRY_TIMES", 1)):
		status, err = "retry", errors.New("retry requested by worker")
		if ms := envInt("WORKER_RETRY_AFTER_MS", 0); ms > 0 {
			err = fmt.Errorf("retry requested by worker: %w", idemproxy.RetryAfter(time.Duration(ms)*time.Millisecond))
		}
	}
	if path := os.Getenv("WORKER_REPORT"); path != "" {
		row := newRow(d, status, start, time.Now())
		row.SpanTraceID, row.SpanParentID = spanIDs(ctx)
		row.RemainingMs, row.Stopped = remaining, stopped
		if rerr := appendReport(path, row); rerr != nil {
			log.Printf("report: %v", rerr)
		}
	}
	printLine(d)
	return err
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("example: ")
	endpoint := os.Getenv("IDEMPROXY_ENDPOINT")
	if endpoint == "" {
		endpoint = idemproxy.DefaultEndpoint
	}
	flag.StringVar(&endpoint, "endpoint", endpoint, "idemproxy's app.endpoint")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	opts := []idemproxy.Option{
		idemproxy.Concurrency(envInt("WORKER_CONCURRENCY", 1)),
	}
	if n := envInt("WORKER_MAX_BYTES", 0); n != 0 {
		opts = append(opts, idemproxy.MaxEntryBytes(n))
	}
	h := idemproxy.Handler(handle)
	if os.Getenv("WORKER_REPORT") != "" {
		h = idemproxyotel.Handler(h, idemproxyotel.WithTracerProvider(sdktrace.NewTracerProvider()))
	}
	log.Printf("waiting for deliveries on %s", endpoint)
	if err := idemproxy.Serve(ctx, endpoint, h, opts...); err != nil {
		log.Fatal(err)
	}
}
