"""Where the tests find the repository's files, wherever the test module sits."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
FIXTURES = ROOT / "tests" / "fixtures"
