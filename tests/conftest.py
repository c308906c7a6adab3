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
