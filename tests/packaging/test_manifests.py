"""What every client package carries and says, checked without building it (a few
seconds): the license text. The tests that build each package (test_<lang>.py)
check the same things in the built artifact."""
import pytest

from conftest import ROOT, export, run

CLIENTS = ["c", "go", "java", "node", "python", "rust"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Only what git tracks of clients/ (an untracked LICENSE does not count)."""
    return export("clients", tmp_path_factory.mktemp("manifests") / "export")


@pytest.mark.parametrize("client", CLIENTS)
def test_every_client_carries_the_license(clean, client):
    lic = clean / client / "LICENSE"
    assert lic.is_file(), f"clients/{client}/LICENSE is not tracked (make license-copies)"
    assert lic.read_bytes() == (ROOT / "LICENSE").read_bytes(), \
        f"clients/{client}/LICENSE differs from LICENSE (make license-copies)"


def test_the_crate_lists_the_license(clean):
    files = run(["cargo", "package", "--list", "--offline"], clean / "rust").stdout.split()
    assert "LICENSE" in files, files
