package pgfence_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the test's driver only: pgfence needs none

	idemproxy "github.com/idemproxy/idemproxy/clients/go"
	"github.com/idemproxy/idemproxy/clients/go/pgfence"
)

// fixture is one test's schema on the PostgreSQL of IDEMPROXY_TEST_PG: the
// inbox and fence tables (pgfence.Schema) and an append-only effects table,
// so an effect applied twice shows as two rows.
type fixture struct {
	db    *sql.DB
	runs  atomic.Int32 // handler calls
	fails error        // what the handler returns after writing, if set
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	url := os.Getenv("IDEMPROXY_TEST_PG")
	if url == "" {
		t.Skip("IDEMPROXY_TEST_PG is not set: run under tests/with-postgres for a PostgreSQL")
	}
	admin, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	b := make([]byte, 6)
	rand.Read(b)
	schema := "pgfence_" + hex.EncodeToString(b)
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE") })
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	db, err := sql.Open("pgx", url+sep+"search_path="+schema) // every pooled connection
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.ExecContext(ctx, pgfence.Schema); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE effects (key text NOT NULL, token bigint NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return &fixture{db: db}
}

// handle is the user's handler: it writes the effect in the transaction.
func (f *fixture) handle(ctx context.Context, tx *sql.Tx, d *idemproxy.Delivery) error {
	f.runs.Add(1)
	if _, err := tx.ExecContext(ctx, "INSERT INTO effects VALUES ($1, $2)", d.Key, int64(d.FencingToken)); err != nil {
		return err
	}
	return f.fails
}

func (f *fixture) deliver(t *testing.T, d *idemproxy.Delivery) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return pgfence.Handler(f.db, f.handle)(ctx, d)
}

func (f *fixture) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fixture) effects(t *testing.T, key string) int {
	return f.count(t, "SELECT count(*) FROM effects WHERE key = $1", key)
}

func (f *fixture) inbox(t *testing.T, key string) int {
	return f.count(t, "SELECT count(*) FROM idemproxy_inbox WHERE key = $1", key)
}

func (f *fixture) fence(t *testing.T, lock string) (token int64, ok bool) {
	t.Helper()
	err := f.db.QueryRow("SELECT token FROM idemproxy_fence WHERE lock = $1", lock).Scan(&token)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return token, true
}

func delivery(key, entry, lock string, token uint64) *idemproxy.Delivery {
	return &idemproxy.Delivery{Stream: "orders", EntryID: entry, Key: key, Attempt: 1,
		FencingToken: token, Lock: lock}
}

// isAck, isRetry: what idemproxy.Serve answers for a handler's error
// (the base package's TestAnswers checks that mapping).
func isAck(err error) bool { return err == nil }
func isRetry(err error) bool {
	var drop *idemproxy.DropError
	return err != nil && !errors.As(err, &drop)
}

func TestNewKeyRunsAndCommits(t *testing.T) {
	f := newFixture(t)
	if err := f.deliver(t, delivery("order-1", "1-0", "order-1", 1000)); !isAck(err) {
		t.Fatalf("answer %v, want ACK", err)
	}
	if f.runs.Load() != 1 || f.effects(t, "order-1") != 1 {
		t.Errorf("handler runs %d, effect rows %d: want 1, 1", f.runs.Load(), f.effects(t, "order-1"))
	}
	var stream, entry string
	var token int64
	err := f.db.QueryRow("SELECT stream, entry_id, token FROM idemproxy_inbox WHERE key = 'order-1'").
		Scan(&stream, &entry, &token)
	if err != nil || stream != "orders" || entry != "1-0" || token != 1000 {
		t.Errorf("inbox row %q %q %d (%v), want orders 1-0 1000", stream, entry, token, err)
	}
	if tok, ok := f.fence(t, "order-1"); !ok || tok != 1000 {
		t.Errorf("fence row %d %v, want 1000", tok, ok)
	}
}

func TestDoneKeySkipsHandler(t *testing.T) {
	f := newFixture(t)
	if err := f.deliver(t, delivery("order-1", "1-0", "order-1", 1000)); !isAck(err) {
		t.Fatalf("first answer %v, want ACK", err)
	}
	// A copy of the event (another entry, the same key) after Redis forgot
	// the done mark, with a newer token: the inbox answers.
	if err := f.deliver(t, delivery("order-1", "2-0", "order-1", 2000)); !isAck(err) {
		t.Fatalf("second answer %v, want ACK", err)
	}
	if f.runs.Load() != 1 || f.effects(t, "order-1") != 1 {
		t.Errorf("handler runs %d, effect rows %d: want 1, 1", f.runs.Load(), f.effects(t, "order-1"))
	}
	if n := f.count(t, "SELECT count(*) FROM idemproxy_inbox WHERE entry_id = '1-0'"); n != 1 {
		t.Errorf("inbox rows of the first entry %d, want 1 (unchanged)", n)
	}
	if tok, _ := f.fence(t, "order-1"); tok != 1000 {
		t.Errorf("fence token %d, want 1000: the done key's transaction was rolled back", tok)
	}
}

func TestStaleTokenRolledBack(t *testing.T) {
	f := newFixture(t)
	// lock_key: two keys, one resource. The holder with the later token
	// writes first; the one whose lease ran out comes after.
	if err := f.deliver(t, delivery("debit-2", "2-0", "account:7", 2000)); !isAck(err) {
		t.Fatalf("newer holder: answer %v, want ACK", err)
	}
	err := f.deliver(t, delivery("debit-1", "1-0", "account:7", 1000))
	if !isRetry(err) || err.Error() != "stale fencing token" || !errors.Is(err, pgfence.ErrStale) {
		t.Fatalf("stale holder: answer %v, want RETRY \"stale fencing token\"", err)
	}
	if n := f.effects(t, "debit-1"); n != 0 {
		t.Errorf("stale holder's effect rows %d, want 0", n)
	}
	if n := f.inbox(t, "debit-1"); n != 0 {
		t.Errorf("stale holder's inbox rows %d, want 0", n)
	}
	if tok, _ := f.fence(t, "account:7"); tok != 2000 {
		t.Errorf("fence token %d, want 2000", tok)
	}
	// The same holder (the same token) writes again: accepted.
	if err := f.deliver(t, delivery("debit-3", "3-0", "account:7", 2000)); !isAck(err) {
		t.Fatalf("same token again: answer %v, want ACK", err)
	}
	if n := f.effects(t, "debit-3"); n != 1 {
		t.Errorf("same token's effect rows %d, want 1", n)
	}
}

func TestHandlerErrorRollsBack(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		drop bool
	}{
		{"retry", errors.New("downstream refused"), false},
		{"drop", idemproxy.Drop("not an order"), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			f.fails = c.err
			err := f.deliver(t, delivery("order-1", "1-0", "order-1", 1000))
			var drop *idemproxy.DropError
			if err == nil || err.Error() != c.err.Error() || errors.As(err, &drop) != c.drop {
				t.Fatalf("answer %v, want the handler's error (drop %v)", err, c.drop)
			}
			if c.name == "retry" && !isRetry(err) {
				t.Errorf("answer %v, want RETRY", err)
			}
			if f.effects(t, "order-1") != 0 || f.inbox(t, "order-1") != 0 {
				t.Errorf("effect rows %d, inbox rows %d: want 0, 0", f.effects(t, "order-1"), f.inbox(t, "order-1"))
			}
			if _, ok := f.fence(t, "order-1"); ok {
				t.Error("fence row written by a failed transaction")
			}
			// The redelivery does the work.
			f.fails = nil
			if err := f.deliver(t, delivery("order-1", "1-0", "order-1", 1001)); !isAck(err) {
				t.Fatalf("redelivery: answer %v, want ACK", err)
			}
			if f.effects(t, "order-1") != 1 {
				t.Errorf("effect rows after the redelivery %d, want 1", f.effects(t, "order-1"))
			}
		})
	}
}

func TestTokenZeroIsInboxOnly(t *testing.T) {
	f := newFixture(t)
	for _, entry := range []string{"1-0", "2-0"} {
		if err := f.deliver(t, delivery("order-1", entry, "", 0)); !isAck(err) {
			t.Fatalf("%s: answer %v, want ACK", entry, err)
		}
	}
	if f.runs.Load() != 1 || f.effects(t, "order-1") != 1 || f.inbox(t, "order-1") != 1 {
		t.Errorf("handler runs %d, effect rows %d, inbox rows %d: want 1, 1, 1",
			f.runs.Load(), f.effects(t, "order-1"), f.inbox(t, "order-1"))
	}
	if n := f.count(t, "SELECT count(*) FROM idemproxy_fence"); n != 0 {
		t.Errorf("fence rows %d, want 0 without fencing", n)
	}
}

// Two holders of one key at once (a lease that ran out, a Redis that lost
// the lock), on two connections: the second waits on the first's inbox row,
// then finds the key done. The handler runs once.
func TestConcurrentHoldersOfOneKey(t *testing.T) {
	f := newFixture(t)
	entered := make(chan struct{}, 2)
	release := make(chan struct{})
	h := pgfence.Handler(f.db, func(ctx context.Context, tx *sql.Tx, d *idemproxy.Delivery) error {
		entered <- struct{}{}
		<-release
		return f.handle(ctx, tx, d)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	answers := make(chan error, 2)
	go func() { answers <- h(ctx, delivery("order-1", "1-0", "order-1", 1000)) }()
	<-entered // the first holds the inbox row, uncommitted
	go func() { answers <- h(ctx, delivery("order-1", "1-0", "order-1", 2000)) }()
	// Wait until the second is blocked on the first's row locks.
	for waiting := 0; waiting == 0; {
		select {
		case <-entered:
			close(release)
			t.Fatal("the second holder ran the handler while the first was in it")
		case <-ctx.Done():
			close(release)
			t.Fatal("the second holder never waited for the first")
		case <-time.After(20 * time.Millisecond):
		}
		waiting = f.count(t, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "+
			"AND datname = current_database()")
	}
	close(release)
	for i := 0; i < 2; i++ {
		if err := <-answers; !isAck(err) {
			t.Errorf("answer %v, want ACK", err)
		}
	}
	if f.runs.Load() != 1 || f.effects(t, "order-1") != 1 {
		t.Errorf("handler runs %d, effect rows %d: want 1, 1", f.runs.Load(), f.effects(t, "order-1"))
	}
}

// Claim on the caller's own transaction: the lower-level step.
func TestClaimOnCallersTransaction(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	claim := func(d *idemproxy.Delivery, commit bool) pgfence.Outcome {
		t.Helper()
		tx, err := f.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		o, err := pgfence.Claim(ctx, tx, d)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		return o
	}
	if o := claim(delivery("a", "1-0", "r", 2000), true); o != pgfence.Run {
		t.Errorf("new key: %v, want run", o)
	}
	if o := claim(delivery("a", "1-0", "r", 3000), false); o != pgfence.Done {
		t.Errorf("done key: %v, want done", o)
	}
	if o := claim(delivery("b", "2-0", "r", 1000), false); o != pgfence.Stale {
		t.Errorf("stale token: %v, want stale", o)
	}
	if o := claim(delivery("c", "3-0", "", 0), false); o != pgfence.Run {
		t.Errorf("token 0: %v, want run", o)
	}
	// A delivery from an idemproxy without Delivery.lock: the key's fence row.
	if o := claim(delivery("d", "4-0", "", 4000), true); o != pgfence.Run {
		t.Errorf("no lock: %v, want run", o)
	}
	if tok, ok := f.fence(t, "d"); !ok || tok != 4000 {
		t.Errorf("no lock: fence row %d %v, want the key's, 4000", tok, ok)
	}
}

func TestTokenBeyondBigintIsAnError(t *testing.T) {
	d := delivery("a", "1-0", "a", 1<<63)
	if _, err := pgfence.Claim(context.Background(), nil, d); err == nil ||
		!strings.Contains(err.Error(), "does not fit a bigint") {
		t.Errorf("err %v, want one that says the token does not fit", err)
	}
}

// The copy shipped in this package is the repository's migration, byte for
// byte (skipped in an exported module, where the repository is not around).
func TestSchemaIsTheRepositorysFile(t *testing.T) {
	want, err := os.ReadFile("../../../sql/postgresql/001_idemproxy_inbox.sql")
	if errors.Is(err, os.ErrNotExist) {
		t.Skip("not in the repository: no sql/postgresql/ to compare with")
	}
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal([]byte(pgfence.Schema), want) {
		t.Error("pgfence/001_idemproxy_inbox.sql differs from sql/postgresql/001_idemproxy_inbox.sql: copy it again")
	}
}

// Importing the client builds no database code: pgfence is the only way in.
func TestClientPullsNoDriver(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/idemproxy/idemproxy/clients/go").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "database/sql") || strings.HasPrefix(p, "github.com/jackc/") ||
			strings.HasPrefix(p, "github.com/lib/pq") {
			t.Errorf("the client package depends on %s", p)
		}
	}
}
