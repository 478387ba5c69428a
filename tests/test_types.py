"""The library type-checks: mypy over its packages ([tool.mypy] in pyproject.toml) reports no
error, so CI (make test) holds the types `make lint` checks."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MYPY = Path(sys.executable).parent / "mypy"


@pytest.mark.skipif(not MYPY.exists() and shutil.which("mypy") is None,
                    reason="mypy is in the dev extra")
def test_the_library_type_checks(tmp_path):
    out = subprocess.run([str(MYPY if MYPY.exists() else shutil.which("mypy")),
                          "--cache-dir", str(tmp_path / "cache")], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert "Success: no issues found" in out.stdout
