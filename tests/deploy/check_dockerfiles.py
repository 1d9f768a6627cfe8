#!/usr/bin/env python3
"""Check a Dockerfile of deploy/docker without a Docker engine.

    check_dockerfiles.py DOCKERFILE IMAGE STAGED_TREE

IMAGE is the argument its build stage gives deploy/docker/build.sh (idemproxy or
worker); STAGED_TREE is what that script staged on this machine. Checks: a
build stage FROM debian:12-slim that runs `deploy/docker/build.sh IMAGE DIR`; a
final stage FROM debian:12-slim that copies only DIR from the build stage, runs
as a numeric non-root USER, and whose ENTRYPOINT (and HEALTHCHECK command, which
for the idemproxy image must be `idemproxy health`) name a binary present in the
staged tree; the runtime libraries installed as Debian packages: one RUN in the
final stage that bind-mounts DIR.packages from the build stage and apt-get
installs that list (--no-install-recommends, apt's lists removed after), and no
other package manager use; STAGED_TREE.packages, the list build.sh wrote, holds
package names (for the idemproxy image, ca-certificates among them); a
Dockerfile.dockerignore beside it that keeps the host's build/ out of the context;
the image records what it was built from: the final stage takes ARG COMMIT and
ARG VERSION (its default proxy/px.h's PX_VERSION) and sets the standard OCI
labels org.opencontainers.image.* (title, description, version "$VERSION",
revision "$COMMIT", source, licenses as LICENSE says), and for the idemproxy
image the build stage takes ARG COMMIT too, for build.sh (the binary's
`idemproxy version` and build_info{commit}: the context has no .git).
Prints one line per problem; exit 0 when there is none.
"""

import json
import os
import re
import shlex
import sys

BASE = "debian:12-slim"


def instructions(path):
    """[(INSTRUCTION, args-text)], continuation lines joined, comments dropped."""
    out, cur = [], ""
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not cur and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if cur and line.lstrip().startswith("#"):
                continue
            if line.endswith("\\"):
                cur += line[:-1] + " "
                continue
            cur += line
            word, _, rest = cur.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            cur = ""
    return out


def exec_form(text):
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)
    return ["/bin/sh", "-c", text]


OCI_LABELS = ("title", "description", "version", "revision", "source", "licenses")


def arg_defaults(stage):
    """{name: default or None} of the stage's ARG lines."""
    out = {}
    for ins, args in stage["ins"]:
        if ins == "ARG":
            name, eq, default = args.partition("=")
            out[name.strip()] = shlex.split(default)[0] if eq and shlex.split(default) else ("" if eq else None)
    return out


def provenance(build, final, image):
    problems = []
    fargs = arg_defaults(final)
    for a in ("COMMIT", "VERSION"):
        if a not in fargs:
            problems.append(f"the runtime stage has no ARG {a} (for the org.opencontainers.image labels)")
    try:
        with open("proxy/px.h", encoding="utf-8") as f:
            m = re.search(r'^#define PX_VERSION "([^"]*)"', f.read(), re.M)
        if m and fargs.get("VERSION") not in (None, m.group(1)):
            problems.append(f"ARG VERSION={fargs['VERSION']}: proxy/px.h says PX_VERSION {m.group(1)}")
    except OSError:
        problems.append("proxy/px.h not found: run from the repository root")
    labels = {}
    for ins, args in final["ins"]:
        if ins == "LABEL":
            for word in shlex.split(args):
                k, _, v = word.partition("=")
                labels[k] = v
    for name in OCI_LABELS:
        if not labels.get(f"org.opencontainers.image.{name}"):
            problems.append(f"no LABEL org.opencontainers.image.{name}")
    for name, want in (("version", "VERSION"), ("revision", "COMMIT")):
        got = labels.get(f"org.opencontainers.image.{name}")
        if got is not None and got not in (f"${want}", f"${{{want}}}"):
            problems.append(f"LABEL org.opencontainers.image.{name}={got}: want the build argument ${want}")
    try:
        with open("LICENSE", encoding="utf-8") as f:
            text = f.read(2000)
        if "Apache License" in text and "Version 2.0" in text:
            got = labels.get("org.opencontainers.image.licenses")
            if got is not None and got != "Apache-2.0":
                problems.append(f"LABEL org.opencontainers.image.licenses={got}: LICENSE is Apache-2.0")
    except OSError:
        problems.append("LICENSE not found: run from the repository root")
    if image == "idemproxy" and "COMMIT" not in arg_defaults(build):
        problems.append("the build stage has no ARG COMMIT: the binary would report commit \"\" "
                        "(the build context has no .git)")
    return problems


def check(dockerfile, image, staged):
    problems = []
    stages = []  # [{"from":..., "name":..., "ins": [...]}]
    for ins, args in instructions(dockerfile):
        if ins == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append({"from": parts[0], "name": name, "ins": []})
        elif not stages:
            if ins != "ARG":
                problems.append(f"{ins} before the first FROM")
        else:
            stages[-1]["ins"].append((ins, args))
    if len(stages) < 2:
        return problems + [f"{len(stages)} stage(s): want a build stage and a runtime stage"]
    build, final = stages[0], stages[-1]
    for s in (build, final):
        if s["from"] != BASE:
            problems.append(f"stage FROM {s['from']}: want {BASE}")
    stage_dir = None
    for ins, args in build["ins"]:
        if ins == "RUN":
            m = re.search(r"deploy/docker/build\.sh\s+(\S+)\s+(\S+)", args)
            if m:
                if m.group(1) != image:
                    problems.append(f"build stage builds {m.group(1)!r}, want {image!r}")
                stage_dir = m.group(2).rstrip("/")
    if stage_dir is None:
        problems.append("the build stage does not run deploy/docker/build.sh IMAGE DIR")
    copies = [a for i, a in final["ins"] if i in ("COPY", "ADD")]
    if not copies:
        problems.append("the runtime stage copies nothing")
    for a in copies:
        words = a.split()
        src = [w for w in words if not w.startswith("--")]
        frm = [w for w in words if w.startswith("--from=")]
        if not frm or frm[0] != f"--from={build['name']}" or len(src) != 2 \
                or src[0].rstrip("/") != stage_dir or src[1] != "/":
            problems.append(f"runtime COPY {a!r}: want only COPY --from={build['name']} {stage_dir}/ /")
    installs = 0
    for ins, args in final["ins"]:
        if ins != "RUN" or not re.search(r"\b(apt-get|apt|dpkg|aptitude)\b", args):
            continue
        m = re.search(r"--mount=type=bind,from=(\S+?),source=(\S+?),target=(\S+)", args)
        want = f"{stage_dir}.packages"
        if m is None or m.group(1) != build["name"] or m.group(2) != want:
            problems.append(f"the runtime stage uses a package manager other than to install "
                            f"{want} from the build stage: RUN {args}")
            continue
        target = m.group(3)
        rest = args[m.end():]
        if re.search(r"(^|&&|;|\|\|?)\s*(\S+=\S+\s+)*(apt|dpkg|aptitude)\s", rest):
            problems.append(f"the runtime stage installs packages another way: RUN {args}")
        if not re.search(r"apt-get install -y --no-install-recommends \$\(cat " + re.escape(target) + r"\)", rest):
            problems.append(f"the runtime stage does not apt-get install -y --no-install-recommends "
                            f"$(cat {target}): RUN {args}")
        if "rm -rf /var/lib/apt/lists/*" not in rest:
            problems.append("the runtime stage keeps apt's lists: rm -rf /var/lib/apt/lists/* after installing")
        installs += 1
    if installs != 1:
        problems.append(f"{installs} RUN(s) install the runtime packages: want one, from "
                        f"{stage_dir}.packages (the libraries as Debian packages, not loose files)")
    listed = staged.rstrip("/") + ".packages"
    if not os.path.isfile(listed):
        problems.append(f"no {listed}: build.sh lists the runtime packages there")
    else:
        pkgs = [l.strip() for l in open(listed, encoding="utf-8") if l.strip()]
        bad = [p for p in pkgs if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", p)]
        if not pkgs or bad:
            problems.append(f"{listed}: want Debian package names, one a line; got {pkgs!r}")
        if image == "idemproxy" and "ca-certificates" not in pkgs:
            problems.append(f"{listed} lacks ca-certificates: no CA store for rediss:// without ca_file")
    users = [a for i, a in final["ins"] if i == "USER"]
    if not users:
        problems.append("no USER in the runtime stage: it would run as root")
    else:
        uid = users[-1].split(":")[0]
        if not uid.isdigit() or int(uid) == 0:
            problems.append(f"USER {users[-1]}: want a numeric non-root uid (runAsNonRoot can verify it)")
    entry = [a for i, a in final["ins"] if i == "ENTRYPOINT"]
    if not entry:
        problems.append("no ENTRYPOINT")
    else:
        argv = exec_form(entry[-1])
        if not os.path.isfile(os.path.join(staged, argv[0].lstrip("/"))):
            problems.append(f"ENTRYPOINT {argv[0]} is not in the staged tree {staged}")
    hc = [a for i, a in final["ins"] if i == "HEALTHCHECK"]
    if image == "idemproxy":
        if not hc:
            problems.append("no HEALTHCHECK")
        else:
            cmd = hc[-1].split(" CMD ", 1)
            if len(cmd) != 2:
                problems.append(f"HEALTHCHECK without CMD: {hc[-1]}")
            else:
                argv = exec_form(cmd[1])
                if argv[:2] != ["/usr/local/bin/idemproxy", "health"] and argv[:2] != ["idemproxy", "health"]:
                    problems.append(f"HEALTHCHECK runs {shlex.join(argv)}: want idemproxy health")
                elif argv[0].startswith("/") and not os.path.isfile(os.path.join(staged, argv[0].lstrip("/"))):
                    problems.append(f"HEALTHCHECK binary {argv[0]} is not in the staged tree")
    problems += provenance(build, final, image)
    ignore = dockerfile + ".dockerignore"
    if not os.path.isfile(ignore):
        problems.append(f"no {os.path.basename(ignore)}: the host's build/ would enter the context")
    else:
        pats = [l.strip().rstrip("/") for l in open(ignore, encoding="utf-8")
                if l.strip() and not l.startswith("#")]
        if not any(p in ("build", "**/build") for p in pats):
            problems.append(f"{ignore} does not exclude build/")
    return problems


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    problems = check(*argv)
    for p in problems:
        print(f"{argv[0]}: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
