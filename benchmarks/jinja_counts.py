#!/usr/bin/env python3
# Copyright: sparkops maintainers
# Apache-2.0
"""How much logic the roles and playbooks still keep in Jinja (issue 24), so a change can be measured.

Prints four figures for the repository it runs in (or the one given as the first argument):

- vars_lines: lines in roles/*/vars/main.yml, all roles;
- set_fact: tasks using set_fact (ansible.builtin.set_fact or set_fact) in roles/ and playbooks/;
- jinja_lines: lines holding `{{` or `{%` in the .yml/.yaml files of roles/ and playbooks/;
- jinja_blocks: YAML block scalars (`>`, `|`, with any chomping indicator) whose content holds Jinja.

Run: python3 benchmarks/jinja_counts.py [repo] [--json]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# A mapping value or list item that opens a block scalar: `key: >-`, `- |`, `key: |+2`, ...
BLOCK_START = re.compile(r"^(\s*)(?:-\s+|[^#\s][^#]*?:\s+)(?:!\S+\s+)?[>|][+-]?\d*\s*(?:#.*)?$")
SET_FACT = re.compile(r"^\s*(?:-\s+)?(?:ansible\.builtin\.)?set_fact:")


def yaml_files(root: Path) -> list[Path]:
    out = []
    for top in ("roles", "playbooks"):
        for ext in ("*.yml", "*.yaml"):
            out.extend((root / top).rglob(ext))
    return sorted(set(out))


def jinja_blocks(lines: list[str]) -> int:
    """Block scalars whose content (the lines indented deeper than the key) holds Jinja."""
    count = 0
    i = 0
    while i < len(lines):
        m = BLOCK_START.match(lines[i])
        if not m:
            i += 1
            continue
        indent = len(m.group(1))
        j = i + 1
        has_jinja = False
        while j < len(lines):
            line = lines[j]
            if line.strip() and len(line) - len(line.lstrip()) <= indent:
                break
            has_jinja = has_jinja or "{{" in line or "{%" in line
            j += 1
        count += has_jinja
        i = j
    return count


def counts(root: Path) -> dict:
    vars_lines = sum(len(p.read_text().splitlines()) for p in sorted(root.glob("roles/*/vars/main.yml")))
    set_fact = jinja_lines = blocks = 0
    for path in yaml_files(root):
        lines = path.read_text().splitlines()
        set_fact += sum(1 for ln in lines if SET_FACT.match(ln))
        jinja_lines += sum(1 for ln in lines if "{{" in ln or "{%" in ln)
        blocks += jinja_blocks(lines)
    return {"vars_lines": vars_lines, "set_fact": set_fact, "jinja_lines": jinja_lines, "jinja_blocks": blocks}


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--json"]
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1]
    result = counts(root)
    if "--json" in argv:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
