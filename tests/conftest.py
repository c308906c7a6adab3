"""Shared pytest setup: make `ansible_collections.sparkops.cluster` importable from a plain checkout."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTIONS = ROOT / "collections"
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))

FIXTURES = ROOT / "tests" / "fixtures"
sys.path.insert(0, str(ROOT / "tests" / "unit"))
# `from conftest import ...` in the tests: pytest puts tests/ on the path from a checkout, but
# `ansible-test units` (the installed collection) loads this file as a plugin only.
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))


def pytest_configure(config):
    # Registered here, not in pyproject.toml: `ansible-test units` runs with its own ini and --strict-markers.
    config.addinivalue_line(
        "markers",
        "timing: asserts on wall-clock time (a rate, a deadline a real process must meet); make test runs these "
        "at the normal CPU priority, apart from the other unit tests, which take only the CPU the cluster leaves idle",
    )
