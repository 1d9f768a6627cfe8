"""The Java client as Maven Central would receive it: `mvn -Prelease install`
(the jar, its -sources and -javadoc jars and the pom) from what git tracks of
clients/java, into a local repository of the test's own (seeded from
~/.m2, so what Maven already downloaded is not downloaded again, and an
artifact installed by an earlier run cannot stand in for this one); then a
Maven project outside the repository that depends on
dev.idemproxy:idemproxy-worker, runs its handlers on an Executor of its own and
logs through java.util.logging, run against a real idemproxy."""
import os
import shutil
import signal
import subprocess
import zipfile
from pathlib import Path

from conftest import ROOM, ROOT, run
from pxtest import pending, publish, wait_for

VERSION = (ROOT / "VERSION").read_text().strip()
MVN = ["mvn", "-B", "-ntp", "-q", "-Dstyle.color=never"]

APP_POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0"
         xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
         xsi:schemaLocation="http://maven.apache.org/POM/4.0.0 https://maven.apache.org/xsd/maven-4.0.0.xsd">
  <modelVersion>4.0.0</modelVersion>
  <groupId>com.example</groupId>
  <artifactId>orders-worker</artifactId>
  <version>1.0</version>
  <properties>
    <maven.compiler.release>17</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencies>
    <dependency>
      <groupId>dev.idemproxy</groupId>
      <artifactId>idemproxy-worker</artifactId>
      <version>%(version)s</version>
    </dependency>
  </dependencies>
  <build>
    <plugins>
      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-compiler-plugin</artifactId><version>3.14.1</version></plugin>
      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-resources-plugin</artifactId><version>3.3.1</version></plugin>
      <plugin><groupId>org.apache.maven.plugins</groupId><artifactId>maven-dependency-plugin</artifactId><version>3.8.1</version></plugin>
    </plugins>
  </build>
</project>
"""

# The application's own idemproxy.v1 classes (what generating the schema without
# a java_package gives): the library must not bring a second copy of them.
APP_OWN_PROTO = """package idemproxy.v1;

public final class Idemproxy {
    public static String who() { return "the application's own idemproxy.v1"; }
}
"""

APP_MAIN = """package com.example;

import dev.idemproxy.worker.Worker;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

public final class Main {
    public static void main(String[] args) throws InterruptedException {
        System.out.println(idemproxy.v1.Idemproxy.who());
        ExecutorService handlers = Executors.newCachedThreadPool(r -> new Thread(r, "app-handler"));
        Worker worker = new Worker();
        worker.closeOnSignals();
        worker.serve(args[0], 4, handlers, d -> {
            String where = Thread.currentThread().getName();
            if (d.key().equals("k2") && d.attempt() == 1) {
                System.out.println(d.key() + " attempt=1 fails on " + where);
                throw new IllegalStateException("k2 is not ready");
            }
            System.out.println(d.key() + " attempt=" + d.attempt() + " ok on " + where);
        });
        handlers.shutdown();
    }
}
"""


def seed_repository(dest):
    """A local Maven repository for this test: a copy of ~/.m2/repository
    without any dev.idemproxy artifact."""
    home = Path.home() / ".m2" / "repository"
    if home.is_dir():
        shutil.copytree(home, dest, symlinks=True,
                        ignore=lambda d, names: ["idemproxy"] if Path(d) == home / "dev" else [])
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def test_installed_java_client_serves_a_maven_project_outside_the_repository(env, exported, tmp_path):
    src = exported("clients/java")
    repo = seed_repository(tmp_path / "m2")
    local = f"-Dmaven.repo.local={repo}"
    run(MVN + [local, "-Prelease", "install", "-Dmaven.test.skip=true"], src, timeout=600)

    art = repo / "dev" / "idemproxy" / "idemproxy-worker" / VERSION
    jar = art / f"idemproxy-worker-{VERSION}.jar"
    with zipfile.ZipFile(jar) as z:
        classes = [n for n in z.namelist() if n.endswith(".class")]
        assert z.read("META-INF/LICENSE") == (ROOT / "LICENSE").read_bytes()
    assert "dev/idemproxy/worker/Worker.class" in classes
    assert "dev/idemproxy/worker/proto/Delivery.class" in classes
    assert classes and all(n.startswith("dev/idemproxy/worker/") for n in classes), \
        [n for n in classes if not n.startswith("dev/idemproxy/worker/")]
    with zipfile.ZipFile(art / f"idemproxy-worker-{VERSION}-sources.jar") as z:
        assert "dev/idemproxy/worker/Worker.java" in z.namelist()
    with zipfile.ZipFile(art / f"idemproxy-worker-{VERSION}-javadoc.jar") as z:
        assert "dev/idemproxy/worker/Worker.html" in z.namelist()
    pom = (art / f"idemproxy-worker-{VERSION}.pom").read_text()
    for want in ("<name>Apache-2.0</name>", "<connection>scm:git:https://github.com/idemproxy/idemproxy.git",
                 "<url>https://github.com/idemproxy/idemproxy</url>"):
        assert want in pom, want

    # The user's project: a pom, a main class, and classes of its own in idemproxy.v1.
    app = tmp_path / "app"
    (app / "src/main/java/com/example").mkdir(parents=True)
    (app / "src/main/java/idemproxy/v1").mkdir(parents=True)
    (app / "pom.xml").write_text(APP_POM % {"version": VERSION})
    (app / "src/main/java/com/example/Main.java").write_text(APP_MAIN)
    (app / "src/main/java/idemproxy/v1/Idemproxy.java").write_text(APP_OWN_PROTO)
    run(MVN + [local, "compile", "dependency:build-classpath", "-Dmdep.outputFile=cp.txt",
               "-DincludeScope=runtime"], app, timeout=600)
    cp = (app / "cp.txt").read_text().strip()
    assert str(jar) in cp.split(os.pathsep), cp
    log = app / "worker.log"
    (app / "logging.properties").write_text(
        "handlers=java.util.logging.FileHandler\n"
        f"java.util.logging.FileHandler.pattern={log}\n"
        "java.util.logging.FileHandler.formatter=java.util.logging.SimpleFormatter\n"
        "java.util.logging.SimpleFormatter.format=%4$s %3$s: %5$s%6$s%n\n"
        ".level=INFO\n")

    ep = env.endpoint()
    p = env.proxy([ROOM],
                  endpoint=ep)
    out, err = app / "worker.out", app / "worker.err"
    with open(out, "wb") as fo, open(err, "wb") as fe:
        w = subprocess.Popen(["java", f"-Djava.util.logging.config.file={app / 'logging.properties'}",
                              "-cp", f"target/classes{os.pathsep}{cp}", "com.example.Main", ep],
                             cwd=app, stdout=fo, stderr=fe)
    try:
        keys = ["k1", "k2", "k3"]
        ids = publish(env.r, "room", [{"eventId": k, "n": i} for i, k in enumerate(keys)])
        wait_for(lambda: all((env.r.get("idem:" + k) or "")[:1] == "D" for k in keys), timeout=90,
                 what="every key done")
        wait_for(lambda: pending(env.r, "room", "g") == 0, timeout=30, what="nothing pending")
    finally:
        w.send_signal(signal.SIGTERM)
        rc = w.wait(30)
    assert rc == 0, err.read_text() + out.read_text()
    lines = out.read_text().splitlines()
    assert lines[0] == "the application's own idemproxy.v1"
    assert sorted(lines[1:]) == ["k1 attempt=1 ok on app-handler", "k2 attempt=1 fails on app-handler",
                                 "k2 attempt=2 ok on app-handler", "k3 attempt=1 ok on app-handler"], lines
    # The handler's failure went to the System.Logger (here java.util.logging, into
    # a file), with its exception; the library wrote nothing to stderr itself.
    logged = log.read_text() if log.exists() else ""
    k2 = ids[1] if isinstance(ids[1], str) else ids[1].decode()
    assert (f"WARNING dev.idemproxy.worker: room {k2} key=k2 attempt=1: the handler failed, "
            "answered RETRY\njava.lang.IllegalStateException: k2 is not ready") in logged, logged
    assert err.read_text() == ""
    assert "k2 is not ready" in p.log_text()       # the RETRY's reason reached idemproxy
    assert env.r.xlen("dlq") == 0
