//! The inbox and the fence in your own PostgreSQL transaction (feature
//! `postgres`; docs/database.md in the repository says what they close and why).
//!
//! [`handle`] runs, in one transaction, the inbox statement for the delivery's
//! key, the fence statement for its token (when fencing is on), then your
//! handler's writes, and commits them together:
//!
//! ```no_run
//! use std::sync::{Mutex, PoisonError};
//! use idemproxy_worker::postgres::{driver::{Client, NoTls}, handle};
//! use idemproxy_worker::{serve, Delivery};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let db = Mutex::new(Client::connect(&std::env::var("DATABASE_URL")?, NoTls)?);
//!     serve("ipc:///tmp/idemproxy.sock", 1, |d: &Delivery| {
//!         let mut db = db.lock().unwrap_or_else(PoisonError::into_inner);
//!         handle(&mut db, d, |tx| {
//!             tx.execute("INSERT INTO orders (key, body) VALUES ($1, $2)", &[&d.key, &d.payload])?;
//!             Ok(())
//!         })
//!     })?;
//!     Ok(())
//! }
//! ```
//!
//! The driver is the synchronous [`postgres`](https://docs.rs/postgres) crate,
//! re-exported as [`driver`]: handlers are plain functions on threads of their
//! own, so a blocking client fits them and needs no async runtime of yours.
//! Apply [`MIGRATION`] once per database first.

use ::postgres::{Client, GenericClient, Transaction};

use crate::{Delivery, Error};

/// The `postgres` crate this module uses, for its `Client`, `NoTls`, `Transaction`.
pub use ::postgres as driver;

/// `001_idemproxy_inbox.sql`, the tables `idemproxy_inbox` and `idemproxy_fence`
/// (the crate ships the file in `sql/`): apply it once per database, with your
/// migration tool or `client.batch_execute(MIGRATION)`.
pub const MIGRATION: &str = include_str!("../sql/001_idemproxy_inbox.sql");

/// The reason of the RETRY that answers a refused (stale) fencing token.
pub const STALE_TOKEN: &str = "stale fencing token";

const INBOX: &str = "INSERT INTO idemproxy_inbox (key, stream, entry_id, token) VALUES ($1, $2, $3, $4) \
                     ON CONFLICT (key) DO NOTHING";
const FENCE: &str = "INSERT INTO idemproxy_fence (lock, token) VALUES ($1, $2) \
                     ON CONFLICT (lock) DO UPDATE SET token = EXCLUDED.token \
                     WHERE idemproxy_fence.token <= EXCLUDED.token";

/// What [`step`] found: whether the handler may write in this transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The inbox row is written and the fence passed: run the handler in the
    /// transaction, then commit; ACK.
    Run,
    /// The key's effect is already committed: roll back, do not run the
    /// handler, answer ACK.
    Done,
    /// A higher token for `Delivery.lock` has written, so this holder's lease
    /// was lost: roll back, answer RETRY with [`STALE_TOKEN`].
    Stale,
}

/// Runs the inbox statement and, when `fencing_token > 0`, the fence statement
/// on a transaction the caller owns (a `Transaction`, or a `Client` after its
/// own `BEGIN`), and says what to do next. The caller rolls back on anything
/// but [`Step::Run`]. A token above `i64::MAX` cannot be stored (idemproxy never
/// sends one: Redis integers are signed 64-bit) and is refused as stale.
pub fn step<C: GenericClient>(tx: &mut C, d: &Delivery) -> Result<Step, driver::Error> {
    let Ok(token) = i64::try_from(d.fencing_token) else { return Ok(Step::Stale) };
    if tx.execute(INBOX, &[&d.key, &d.stream, &d.entry_id, &token])? == 0 {
        return Ok(Step::Done);
    }
    if token > 0 && tx.execute(FENCE, &[&d.lock, &token])? == 0 {
        return Ok(Step::Stale);
    }
    Ok(Step::Run)
}

/// Handles `d` in one transaction on `client`: the inbox and fence [`step`],
/// then `handler` with the transaction for its writes, then the commit.
/// Answers as docs/database.md says: a key already done is `Ok(())` (ACK)
/// without running the handler; a stale token is `Err(Error::Retry)` with
/// [`STALE_TOKEN`]; the handler's own error is returned as it is (RETRY, or
/// DROP for `Error::Drop`) and a failure of the helper's statements or of the
/// commit is `Error::Retry` (see [`db_error`]), each after everything was
/// rolled back (the inbox row too).
pub fn handle<F>(client: &mut Client, d: &Delivery, handler: F) -> Result<(), Error>
where
    F: FnOnce(&mut Transaction<'_>) -> Result<(), Error>,
{
    // A transaction dropped without commit (on return or on a panic) is rolled back.
    let mut tx = client.transaction().map_err(db_error)?;
    match step(&mut tx, d).map_err(db_error)? {
        Step::Done => return Ok(()),
        Step::Stale => return Err(Error::Retry(STALE_TOKEN.into())),
        Step::Run => {}
    }
    handler(&mut tx)?;
    tx.commit().map_err(db_error)
}

/// `Error::Retry` with the driver's error and the database's message ("db error:
/// ERROR: ..."), where `?` alone gives only the driver's "db error":
/// `tx.execute(..).map_err(db_error)?`.
pub fn db_error(e: driver::Error) -> Error {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    Error::Retry(text)
}
