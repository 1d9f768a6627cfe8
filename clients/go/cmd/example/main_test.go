package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	idemproxy "github.com/idemproxy/idemproxy/clients/go"
)

func TestInList(t *testing.T) {
	for _, c := range []struct {
		list, key string
		want      bool
	}{{"a,b", "b", true}, {"a,b", "c", false}, {"", "", false}, {"ab", "a", false}, {"a,,b", "", false}} {
		if got := inList(c.list, c.key); got != c.want {
			t.Errorf("inList(%q, %q) = %v", c.list, c.key, got)
		}
	}
}

// The report is read by tests/integration/test_clients.py: same names and types as the C worker's.
func TestReportLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.jsonl")
	d := &idemproxy.Delivery{Stream: "room", EntryID: "1-0", Key: "k\"1", Payload: []byte(`{"n":1}`),
		Fields:  []idemproxy.Field{{Name: "source", Value: []byte("x")}},
		Attempt: 2, FencingToken: 7, DeadlineUnixMs: 1700000000000,
		Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "x=1"}
	start := time.UnixMilli(1700000000001)
	for i := 0; i < 2; i++ {
		if err := appendReport(path, newRow(d, "retry", start, start.Add(5*time.Millisecond))); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]any
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		var row map[string]any
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		rows = append(rows, row)
	}
	want := map[string]any{"key": "k\"1", "stream": "room", "entry_id": "1-0", "attempt": 2.0,
		"fencing_token": 7.0, "deadline_unix_ms": 1700000000000.0, "payload": `{"n":1}`,
		"fields": map[string]any{"source": "x"}, "status": "retry",
		"start_ms": 1700000000001.0, "end_ms": 1700000000006.0,
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "x=1",
		"span_trace_id": "", "span_parent_id": "", "remaining_ms": -1.0, "stopped": ""}
	if len(rows) != 2 || !reflect.DeepEqual(rows[0], want) {
		t.Errorf("report rows %v\nwant %v", rows, want)
	}
}
