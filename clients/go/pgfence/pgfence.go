// Package pgfence lands an idemproxy handler's effect in PostgreSQL once: the
// handler's writes, an inbox row for the delivery's key and, with fencing on,
// a check of its fencing token against the fence table, all in one
// transaction (docs/database.md in the repository says why each step answers
// as it does).
//
//	db, _ := sql.Open("pgx", url) // or "postgres" (lib/pq): any database/sql driver for PostgreSQL
//	err := idemproxy.Serve(ctx, endpoint, pgfence.Handler(db,
//		func(ctx context.Context, tx *sql.Tx, d *idemproxy.Delivery) error {
//			_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + $1 WHERE id = $2", amount, id)
//			return err // nil: commit, ACK; an error: roll back, RETRY (or DROP)
//		}))
//
// The package uses only database/sql, so it brings no driver: the program
// imports the one it likes (github.com/jackc/pgx/v5/stdlib, github.com/lib/pq).
// Apply Schema (the file 001_idemproxy_inbox.sql of this folder) once per
// database before use.
package pgfence

import (
	"context"
	"database/sql"
	_ "embed" // Schema
	"errors"
	"fmt"
	"math"

	idemproxy "github.com/idemproxy/idemproxy/clients/go"
)

// Schema creates the inbox and fence tables (if they do not exist): the
// repository's sql/postgresql/001_idemproxy_inbox.sql, byte for byte. Apply it
// with your migration tool, or db.ExecContext(ctx, pgfence.Schema).
//
//go:embed 001_idemproxy_inbox.sql
var Schema string

// The statements Claim runs, for whoever runs them on another API (pgx's own,
// say): the inbox's $1..$4 are key, stream, entry id, token; the fence's $1,
// $2 are lock and token. No row affected means Done and Stale respectively.
const (
	InboxSQL = "INSERT INTO idemproxy_inbox (key, stream, entry_id, token) VALUES ($1, $2, $3, $4) " +
		"ON CONFLICT (key) DO NOTHING"
	FenceSQL = "INSERT INTO idemproxy_fence (lock, token) VALUES ($1, $2) " +
		"ON CONFLICT (lock) DO UPDATE SET token = EXCLUDED.token WHERE idemproxy_fence.token <= EXCLUDED.token"
)

// Outcome is what Claim found.
type Outcome int

const (
	// Run: the key is new and the fence let the token through. Run the
	// handler in the transaction and commit; ACK.
	Run Outcome = iota + 1
	// Done: the key's effect is already committed. Roll back, skip the
	// handler, ACK.
	Done
	// Stale: a higher token for the delivery's lock has written, so this
	// holder lost its lease. Roll back, RETRY (ErrStale).
	Stale
)

func (o Outcome) String() string {
	switch o {
	case Run:
		return "run"
	case Done:
		return "done"
	case Stale:
		return "stale"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// ErrStale is what Handler returns for a Stale delivery: RETRY with reason
// "stale fencing token".
var ErrStale = errors.New("stale fencing token")

// Claim runs the inbox statement and, when the delivery has a fencing token,
// the fence statement on tx, the caller's transaction, and says what to do
// with it. The caller rolls back on Done, Stale and an error. Without a
// d.Lock (an idemproxy older than Delivery.lock) the fence row is the key's.
func Claim(ctx context.Context, tx *sql.Tx, d *idemproxy.Delivery) (Outcome, error) {
	if d.FencingToken > math.MaxInt64 {
		return 0, fmt.Errorf("pgfence: fencing token %d does not fit a bigint", d.FencingToken)
	}
	token := int64(d.FencingToken)
	if n, err := affected(tx.ExecContext(ctx, InboxSQL, d.Key, d.Stream, d.EntryID, token)); err != nil {
		return 0, fmt.Errorf("pgfence: inbox: %w", err)
	} else if n == 0 {
		return Done, nil
	}
	if token == 0 { // fencing off: the inbox alone
		return Run, nil
	}
	lock := d.Lock
	if lock == "" {
		lock = d.Key
	}
	if n, err := affected(tx.ExecContext(ctx, FenceSQL, lock, token)); err != nil {
		return 0, fmt.Errorf("pgfence: fence: %w", err)
	} else if n == 0 {
		return Stale, nil
	}
	return Run, nil
}

func affected(r sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

// TxHandler handles one delivery inside the transaction: its writes go
// through tx. It returns what an idemproxy.Handler returns (nil, an error,
// idemproxy.Drop, idemproxy.RetryAfter); it does not commit or roll back.
type TxHandler func(ctx context.Context, tx *sql.Tx, d *idemproxy.Delivery) error

// Handler runs h for each delivery in a transaction on db, after Claim:
//   - the key is in the inbox: roll back, h not run, ACK;
//   - the fence refuses the token: roll back, RETRY (ErrStale);
//   - h fails (or panics): roll back, answered as h's error is (RETRY, or
//     DROP for idemproxy.Drop);
//   - otherwise commit: ACK, or RETRY when the commit fails.
func Handler(db *sql.DB, h TxHandler) idemproxy.Handler {
	return func(ctx context.Context, d *idemproxy.Delivery) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("pgfence: begin: %w", err)
		}
		defer tx.Rollback() // after Commit: sql.ErrTxDone, nothing to undo
		switch o, err := Claim(ctx, tx, d); {
		case err != nil:
			return err
		case o == Done:
			return nil
		case o == Stale:
			return ErrStale
		}
		if err := h(ctx, tx, d); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("pgfence: commit: %w", err)
		}
		return nil
	}
}
