"""proto/idemproxy/v1/idemproxy.proto is the one owner of the wire schema. A
package that must carry the schema inside itself (a crate, an npm package, a
jar) holds a byte-identical copy; `make proto-copies` refreshes them."""
from conftest import ROOT

CANON = ROOT / "proto" / "idemproxy" / "v1" / "idemproxy.proto"


def copies():
    return sorted(p for p in (ROOT / "clients").rglob("idemproxy.proto")
                  if not any(part in ("node_modules", "target", "build") for part in p.parts))


def test_every_copy_of_the_schema_is_the_schema():
    want = CANON.read_bytes()
    stale = [str(p.relative_to(ROOT)) for p in copies() if p.read_bytes() != want]
    assert not stale, f"copies of {CANON.relative_to(ROOT)} that differ (run make proto-copies): {stale}"
