//! The inbox and fence helper (feature `postgres`) against a real PostgreSQL,
//! the one whose URL is in IDEMPROXY_TEST_PG (tests/with-postgres starts one;
//! without it, each test says on stderr that it is skipped, and passes). Each test works in a
//! fresh schema of its own, with the tables of MIGRATION and an `effects` table
//! for the handler's writes.
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use idemproxy_worker::postgres::driver::{Client, NoTls, Transaction};
use idemproxy_worker::postgres::{MIGRATION, STALE_TOKEN, Step, db_error, handle, step};
use idemproxy_worker::{Delivery, Error};

/// A fresh schema for test `name` with the tables; None when there is no PostgreSQL.
fn fresh(name: &str) -> Option<String> {
    let Ok(url) = std::env::var("IDEMPROXY_TEST_PG") else {
        // Straight to stderr, past the test harness's capture: a skip must show.
        let why = format!("skipped {name}: IDEMPROXY_TEST_PG is unset (run under tests/with-postgres)\n");
        let _ = std::io::stderr().write_all(why.as_bytes());
        return None;
    };
    let schema = format!("rs_{name}_{}", std::process::id());
    let mut c = Client::connect(&url, NoTls).expect("connect to IDEMPROXY_TEST_PG");
    c.batch_execute(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}; SET search_path TO {schema};"
    ))
    .unwrap();
    c.batch_execute(MIGRATION).expect("apply the migration");
    c.batch_execute("CREATE TABLE effects (key text NOT NULL, note text NOT NULL)").unwrap();
    Some(schema)
}

/// A new connection working in `schema`.
fn connect(schema: &str) -> Client {
    let mut c = Client::connect(&std::env::var("IDEMPROXY_TEST_PG").unwrap(), NoTls).unwrap();
    c.batch_execute(&format!("SET search_path TO {schema}")).unwrap();
    c
}

fn delivery(key: &str, lock: &str, token: u64) -> Delivery {
    Delivery {
        stream: "orders".into(),
        entry_id: "1700000000000-0".into(),
        key: key.into(),
        lock: lock.into(),
        fencing_token: token,
        attempt: 1,
        ..Default::default()
    }
}

/// The handler's write: one effects row.
fn write(tx: &mut Transaction<'_>, key: &str, note: &str) -> Result<(), Error> {
    tx.execute("INSERT INTO effects (key, note) VALUES ($1, $2)", &[&key, &note])?;
    Ok(())
}

fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

fn stale() -> Result<(), Error> {
    Err(Error::Retry(STALE_TOKEN.into()))
}

#[test]
fn a_new_key_commits_the_handlers_write_with_the_inbox_row() {
    let Some(schema) = fresh("new_key") else { return };
    let mut c = connect(&schema);
    let d = delivery("order-1", "order-1", 1_800_000_000_000_000);
    let mut ran = 0;
    let res = handle(&mut c, &d, |tx| {
        ran += 1;
        write(tx, &d.key, "first")
    });
    assert_eq!(res, Ok(()));
    assert_eq!(ran, 1);
    let row = c.query_one("SELECT key, note FROM effects", &[]).unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, String>(1)), ("order-1".into(), "first".into()));
    let row = c.query_one("SELECT key, stream, entry_id, token FROM idemproxy_inbox", &[]).unwrap();
    let inbox: (String, String, String, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(inbox, ("order-1".into(), "orders".into(), "1700000000000-0".into(), 1_800_000_000_000_000));
    let row = c.query_one("SELECT lock, token FROM idemproxy_fence", &[]).unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, i64>(1)), ("order-1".into(), 1_800_000_000_000_000));
}

#[test]
fn the_same_key_again_is_acked_without_running_the_handler() {
    let Some(schema) = fresh("same_key") else { return };
    let mut c = connect(&schema);
    let first = delivery("order-1", "order-1", 100);
    assert_eq!(handle(&mut c, &first, |tx| write(tx, "order-1", "first")), Ok(()));
    // A copy of the event (another entry id), under a later claim: Redis forgot the done mark.
    let copy = Delivery { entry_id: "1700000000001-0".into(), fencing_token: 200, ..first.clone() };
    let mut ran = false;
    let res = handle(&mut c, &copy, |tx| {
        ran = true;
        write(tx, "order-1", "again")
    });
    assert_eq!(res, Ok(()), "a done key is answered ACK");
    assert!(!ran, "the handler ran for a key already in the inbox");
    assert_eq!(count(&mut c, "SELECT count(*) FROM effects"), 1);
    let entry: String = c.query_one("SELECT entry_id FROM idemproxy_inbox", &[]).unwrap().get(0);
    assert_eq!(entry, "1700000000000-0");
    let token: i64 = c.query_one("SELECT token FROM idemproxy_fence", &[]).unwrap().get(0);
    assert_eq!(token, 100, "a done key's delivery moved the fence");
}

#[test]
fn a_stale_token_is_refused_and_rolled_back() {
    let Some(schema) = fresh("stale") else { return };
    let mut c = connect(&schema);
    // With lock_key, two keys share the lock "room-7": the holder of token 200 wrote first.
    assert_eq!(handle(&mut c, &delivery("b", "room-7", 200), |tx| write(tx, "b", "new holder")), Ok(()));
    let mut ran = false;
    let res = handle(&mut c, &delivery("a", "room-7", 100), |tx| {
        ran = true;
        write(tx, "a", "stale holder")
    });
    assert_eq!(res, stale());
    assert!(!ran, "the stale holder's handler ran");
    assert_eq!(count(&mut c, "SELECT count(*) FROM effects WHERE key = 'a'"), 0);
    assert_eq!(count(&mut c, "SELECT count(*) FROM idemproxy_inbox WHERE key = 'a'"), 0);
    assert_eq!(count(&mut c, "SELECT token FROM idemproxy_fence WHERE lock = 'room-7'"), 200);
    // The same token again (its holder, for the refused key) is accepted and written.
    assert_eq!(handle(&mut c, &delivery("a", "room-7", 200), |tx| write(tx, "a", "same holder")), Ok(()));
    let note: String = c.query_one("SELECT note FROM effects WHERE key = 'a'", &[]).unwrap().get(0);
    assert_eq!(note, "same holder");
    assert_eq!(count(&mut c, "SELECT count(*) FROM idemproxy_inbox"), 2);
}

#[test]
fn a_handler_error_rolls_everything_back() {
    let Some(schema) = fresh("handler_error") else { return };
    let mut c = connect(&schema);
    let d = delivery("order-1", "order-1", 100);
    let res = handle(&mut c, &d, |tx| {
        write(tx, "order-1", "half")?;
        Err(Error::retry("payment service down"))
    });
    assert_eq!(res, Err(Error::Retry("payment service down".into())));
    let drop = handle(&mut c, &d, |tx| {
        write(tx, "order-1", "half")?;
        Err(Error::Drop("bad order".into()))
    });
    assert_eq!(drop, Err(Error::Drop("bad order".into())), "the handler's DROP is the answer");
    // A failing statement of the handler is a RETRY too (db_error: with the database's text).
    let failed = handle(&mut c, &d, |tx| {
        write(tx, "order-1", "half")?;
        tx.execute("INSERT INTO no_such_table VALUES (1)", &[]).map_err(db_error)?;
        Ok(())
    });
    assert!(
        matches!(&failed, Err(Error::Retry(r)) if r.contains("\"no_such_table\" does not exist")),
        "{failed:?}"
    );
    // A commit that fails (a deferred constraint, checked at COMMIT) is a RETRY.
    c.batch_execute(
        "CREATE TABLE seats (seat int, UNIQUE (seat) DEFERRABLE INITIALLY DEFERRED); INSERT INTO seats VALUES (7)",
    )
    .unwrap();
    let commit = handle(&mut c, &d, |tx| {
        write(tx, "order-1", "half")?;
        tx.execute("INSERT INTO seats VALUES (7)", &[])?;
        Ok(())
    });
    assert!(matches!(&commit, Err(Error::Retry(r)) if r.contains("duplicate key")), "{commit:?}");
    // A panicking handler: the transaction is rolled back as it unwinds.
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        handle(&mut c, &d, |tx| {
            write(tx, "order-1", "half")?;
            panic!("handler bug")
        })
    }));
    assert!(panicked.is_err());
    for table in ["effects", "idemproxy_inbox", "idemproxy_fence"] {
        assert_eq!(count(&mut c, &format!("SELECT count(*) FROM {table}")), 0, "{table} kept a row");
    }
    // Nothing was recorded: the redelivery runs the handler.
    assert_eq!(handle(&mut c, &d, |tx| write(tx, "order-1", "done")), Ok(()));
    assert_eq!(count(&mut c, "SELECT count(*) FROM effects"), 1);
}

#[test]
fn token_zero_is_the_inbox_alone() {
    let Some(schema) = fresh("token_zero") else { return };
    let mut c = connect(&schema);
    assert_eq!(handle(&mut c, &delivery("order-1", "", 0), |tx| write(tx, "order-1", "first")), Ok(()));
    assert_eq!(count(&mut c, "SELECT count(*) FROM idemproxy_fence"), 0, "fencing off wrote a fence row");
    assert_eq!(count(&mut c, "SELECT token FROM idemproxy_inbox WHERE key = 'order-1'"), 0);
    let mut ran = false;
    let again = handle(&mut c, &delivery("order-1", "", 0), |tx| {
        ran = true;
        write(tx, "order-1", "again")
    });
    assert_eq!((again, ran), (Ok(()), false));
    assert_eq!(count(&mut c, "SELECT count(*) FROM effects"), 1);
}

#[test]
fn step_on_a_transaction_the_caller_owns() {
    let Some(schema) = fresh("step") else { return };
    let mut c = connect(&schema);
    let mut tx = c.transaction().unwrap();
    assert_eq!(step(&mut tx, &delivery("b", "room-7", 200)).unwrap(), Step::Run);
    tx.commit().unwrap();
    let mut tx = c.transaction().unwrap();
    assert_eq!(step(&mut tx, &delivery("b", "room-7", 300)).unwrap(), Step::Done);
    tx.rollback().unwrap();
    let mut tx = c.transaction().unwrap();
    assert_eq!(step(&mut tx, &delivery("a", "room-7", 100)).unwrap(), Step::Stale);
    tx.rollback().unwrap();
    // A token PostgreSQL's bigint cannot hold is refused, not wrapped or saturated.
    let mut tx = c.transaction().unwrap();
    assert_eq!(step(&mut tx, &delivery("c", "room-7", u64::MAX)).unwrap(), Step::Stale);
    tx.rollback().unwrap();
    assert_eq!(count(&mut c, "SELECT count(*) FROM idemproxy_inbox"), 1);
}

#[test]
fn two_holders_of_one_key_run_the_handler_once() {
    let Some(schema) = fresh("two_holders") else { return };
    let (mut a, mut b, mut watch) = (connect(&schema), connect(&schema), connect(&schema));
    let b_pid: i32 = b.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let (ran, b_waited) = (AtomicUsize::new(0), AtomicBool::new(false));
    let d = delivery("order-1", "order-1", 100);
    let (in_handler, a_in_handler) = mpsc::channel();
    let (res_a, res_b) = thread::scope(|s| {
        let (ran, b_waited, d) = (&ran, &b_waited, &d);
        let holder_a = s.spawn(move || {
            handle(&mut a, d, |tx| {
                ran.fetch_add(1, Ordering::SeqCst);
                write(tx, "order-1", "a")?;
                in_handler.send(()).unwrap();
                // Hold the transaction open until B waits for A's inbox row (or,
                // were there no inbox, has run its handler too).
                let q = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'";
                let until = Instant::now() + Duration::from_secs(60);
                while ran.load(Ordering::SeqCst) < 2 && Instant::now() < until {
                    if watch.query_one(q, &[&b_pid]).unwrap().get::<_, i64>(0) == 1 {
                        b_waited.store(true, Ordering::SeqCst);
                        break;
                    }
                    thread::sleep(Duration::from_millis(20));
                }
                Ok(())
            })
        });
        a_in_handler.recv().unwrap();
        let holder_b = s.spawn(move || {
            handle(&mut b, d, |tx| {
                ran.fetch_add(1, Ordering::SeqCst);
                write(tx, "order-1", "b")
            })
        });
        (holder_a.join().unwrap(), holder_b.join().unwrap())
    });
    assert_eq!(ran.load(Ordering::SeqCst), 1, "both holders ran the handler");
    assert!(b_waited.load(Ordering::SeqCst), "B never waited for A's transaction: no overlap was tested");
    assert_eq!((res_a, res_b), (Ok(()), Ok(())), "both holders are answered ACK");
    let mut c = connect(&schema);
    let row = c.query_one("SELECT key, note FROM effects", &[]).unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, String>(1)), ("order-1".into(), "a".into()));
    assert_eq!(count(&mut c, "SELECT count(*) FROM idemproxy_inbox"), 1);
}
