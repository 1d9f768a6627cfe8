"""sql/postgresql/001_idemproxy_inbox.sql is the one owner of the inbox and
fence tables (docs/database.md). Every client ships a byte-identical copy in
its package; `make sql-copies` refreshes them."""
from conftest import ROOT

CANON = ROOT / "sql" / "postgresql" / "001_idemproxy_inbox.sql"
CLIENTS = ("c", "go", "java", "node", "python", "rust")


def copies():
    return sorted(p for p in (ROOT / "clients").rglob(CANON.name)
                  if not any(part in ("node_modules", "target", "build", "dist", ".venv") for part in p.parts))


def test_every_client_ships_the_tables_once_and_unchanged():
    found = copies()
    per_client = {c: [p for p in found if p.relative_to(ROOT / "clients").parts[0] == c] for c in CLIENTS}
    assert all(len(v) == 1 for v in per_client.values()), \
        {c: [str(p.relative_to(ROOT)) for p in v] for c, v in per_client.items()}
    want = CANON.read_bytes()
    stale = [str(p.relative_to(ROOT)) for p in found if p.read_bytes() != want]
    assert not stale, f"copies of {CANON.relative_to(ROOT)} that differ (run make sql-copies): {stale}"
