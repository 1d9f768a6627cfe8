"""The crate as crates.io receives it: only what git tracks of clients/rust,
`cargo package` (which builds the packaged crate alone, from the .crate's
content), the .crate unpacked and used by a cargo project outside the
repository, its worker run against a real idemproxy. A handler's error
reaches the `log` facade, through the application's logger."""
import os
import re
import tarfile

from conftest import ROOT, run, run_worker

# Third-party artifacts are shared with the client-rust suite (cargo's own
# cache, keyed by package, version, source and features): the crate under
# test is compiled from its packaged source, a different package id.
TARGET = ROOT / "clients" / "rust" / "target"

CARGO_TOML = """[package]
name = "outside-worker"
version = "0.1.0"
edition = "2021"

[dependencies]
idemproxy-worker = {{ path = "{crate}" }}
log = "0.4"
"""

MAIN_RS = r'''use idemproxy_worker::{serve, Delivery, Error};

/// The application's logger: every record on stderr, prefixed "LOG".
struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, r: &log::Record) {
        eprintln!("LOG {} {} {}", r.level(), r.target(), r.args());
    }
    fn flush(&self) {}
}

static LOGGER: Stderr = Stderr;

fn main() {
    log::set_logger(&LOGGER).unwrap();
    log::set_max_level(log::LevelFilter::Info);
    let endpoint = std::env::args().nth(1).expect("endpoint");
    serve(&endpoint, 2, |d: &Delivery| -> Result<(), Error> {
        println!("{} attempt={}", d.key, d.attempt);
        if d.key == "fail-once" && d.attempt == 1 {
            return Err(Error::retry("first try fails on purpose"));
        }
        Ok(())
    })
    .expect("serve");
}
'''


def cargo_env():
    e = dict(os.environ)
    e["CARGO_TARGET_DIR"] = str(TARGET)
    return e


def test_rust_crate_from_clean_export(env, exported, tmp_path):
    # NNG's build needs cmake and a C compiler: the client's Makefile installs them.
    run(["make", "-s", "--no-print-directory", "-C", str(ROOT / "clients" / "rust"), "deps"], ROOT)
    src = exported("clients/rust")
    assert (src / "proto" / "idemproxy" / "v1" / "idemproxy.proto").is_file(), \
        "the crate's copy of the proto is not tracked"
    # As crates.io receives it: cargo package refuses a crate without license or
    # one that does not build from its own content (it verifies by building it).
    run(["cargo", "package", "--locked"], src, env=cargo_env(), timeout=1200)
    version = re.search(r'^version = "([^"]+)"', (src / "Cargo.toml").read_text(), re.M).group(1)
    packed = TARGET / "package" / f"idemproxy-worker-{version}.crate"
    registry = tmp_path / "registry"
    with tarfile.open(packed) as t:
        t.extractall(registry, filter="data")
    crate = registry / f"idemproxy-worker-{version}"
    assert (crate / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    manifest = (crate / "Cargo.toml").read_text()
    assert 'license = "Apache-2.0"' in manifest and "repository = " in manifest, manifest
    assert "../" not in (crate / "build.rs").read_text(), "build.rs reaches outside the crate"

    app = tmp_path / "app"
    (app / "src").mkdir(parents=True)
    (app / "Cargo.toml").write_text(CARGO_TOML.format(crate=crate))
    (app / "src" / "main.rs").write_text(MAIN_RS)
    run(["cargo", "build"], app, env=cargo_env(), timeout=1200)

    keys = ["k1", "k2", "k3", "fail-once"]
    want = sorted([f"{k} attempt=1" for k in keys] + ["fail-once attempt=2"])
    log = run_worker(env, tmp_path, [TARGET / "debug" / "outside-worker"], app, keys, want,
                     exits_zero=False)   # its main() leaves SIGTERM to the default

    # Everything on stderr came through the application's logger (the library
    # printed nothing of its own), and the handler's error is one WARN record.
    logs = log.splitlines()
    assert all(l.startswith("LOG ") for l in logs), logs
    failed = [l for l in logs if " key=fail-once " in l]
    assert len(failed) == 1, logs
    assert failed[0].startswith("LOG WARN idemproxy_worker "), failed[0]
    assert "answered RETRY" in failed[0] and "attempt=1" in failed[0], failed[0]
    assert failed[0].endswith("reason=first try fails on purpose"), failed[0]
