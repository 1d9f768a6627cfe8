"""The Go module as `go get` receives it: only what git tracks of clients/go
(the generated idemproxyv1 package included), required by a module outside the
repository through a `replace` to the exported folder, its worker run against
a real idemproxy. A handler's error reaches log/slog's default logger."""
import json
import os
import re

from conftest import run, run_worker

MODULE = "github.com/idemproxy/idemproxy/clients/go"
LINE = re.compile(r"^(\S+) attempt=(\d+)$")

WORKER = r'''package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	idemproxy "github.com/idemproxy/idemproxy/clients/go"
)

func main() {
	// The application's choice of handler; the library logs to slog.Default().
	slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, nil)))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err := idemproxy.Serve(ctx, os.Args[1], func(ctx context.Context, d *idemproxy.Delivery) error {
		fmt.Printf("%s attempt=%d\n", d.Key, d.Attempt)
		if d.Key == "fail-once" && d.Attempt == 1 {
			return errors.New("first try fails on purpose")
		}
		return nil
	}, idemproxy.Concurrency(2))
	if err != nil {
		slog.Error("serve", "err", err)
		os.Exit(1)
	}
}
'''


def go_env():
    e = dict(os.environ)
    # Outside any workspace, with the toolchain at hand; dependencies come from
    # the module proxy (and its cache, ~/go/pkg/mod).
    e.update(GOWORK="off", GOTOOLCHAIN="local", GOFLAGS="-mod=mod")
    return e


def test_go_module_from_clean_export(env, exported, tmp_path):
    mod = exported("clients/go")
    gomod = (mod / "go.mod").read_text()
    assert gomod.splitlines()[0] == f"module {MODULE}"
    assert "replace" not in gomod, "a replace in the library's go.mod is ignored by its users"
    assert (mod / "idemproxyv1" / "idemproxy.pb.go").is_file(), "the generated package is not tracked"
    # As published: go.sum complete (no -mod=mod here), vet clean.
    e = go_env()
    e.pop("GOFLAGS")
    run(["go", "vet", "./..."], mod, env=e)

    app = tmp_path / "app"
    app.mkdir()
    (app / "go.mod").write_text(
        "module example.com/outside\n\ngo 1.23\n\n"
        f"require {MODULE} v0.0.0-00010101000000-000000000000\n\n"
        f"replace {MODULE} => {mod}\n")
    (app / "main.go").write_text(WORKER)
    run(["go", "mod", "tidy"], app, env=go_env())
    run(["go", "build", "-o", "worker", "."], app, env=go_env())

    keys = ["k1", "k2", "k3", "fail-once"]
    want = sorted([f"{k} attempt=1" for k in keys] + ["fail-once attempt=2"])
    log = run_worker(env, tmp_path, [app / "worker"], app, keys, want)

    # Everything on stderr came through slog (the library printed nothing of
    # its own), and the handler's error is one WARN record about that delivery.
    records = [json.loads(l) for l in log.splitlines()]
    failed = [r for r in records if r.get("key") == "fail-once"]
    assert len(failed) == 1, records
    assert failed[0]["level"] == "WARN" and failed[0]["err"] == "first try fails on purpose"
    assert failed[0]["attempt"] == 1 and failed[0]["stream"] == "room", failed[0]
