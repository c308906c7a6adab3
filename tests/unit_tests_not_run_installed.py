"""Print the unit test files `ansible-test units` did not run on the installed collection, one per line.

Those are the files the build leaves out (galaxy.yml build_ignore) and the files holding a test it skipped
there (a checkout-only test: it reads sim/ or the Makefile, which do not ship). `make test` runs these with
pytest from the checkout, and every other unit test once, installed. Without ansible-test's results (its
stage failed before it wrote them), it prints tests/unit: everything runs from the checkout.

usage: python3 tests/unit_tests_not_run_installed.py <installed collection folder>
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET  # noqa: S405 - ansible-test's own results on this machine
from pathlib import Path


def not_run(installed: Path, files: set[str]) -> list[str]:
    results = sorted((installed / "tests" / "output" / "junit").glob("*.xml"))
    if not results:
        return ["tests/unit"]
    left_out = {f for f in files if not (installed / f).is_file()}
    skipped = set()
    for result in results:
        for case in ET.parse(result).getroot().iter("testcase"):  # noqa: S314 - see above
            if case.find("skipped") is None:
                continue
            parts = (case.get("classname") or "").split(".")
            while parts and "/".join(parts) + ".py" not in files:
                parts.pop()  # a test class's name, then its module's
            if parts:
                skipped.add("/".join(parts) + ".py")
    return sorted(left_out | skipped)


def main() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "tests/unit"], capture_output=True, text=True, check=True
    ).stdout.split()
    files = {f for f in listed if Path(f).name.startswith("test_") and f.endswith(".py")}
    print("\n".join(not_run(Path(sys.argv[1]), files)))


if __name__ == "__main__":
    main()
