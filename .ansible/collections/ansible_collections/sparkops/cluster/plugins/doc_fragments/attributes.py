# Copyright: sparkops maintainers
# Apache License 2.0 (see galaxy.yml)
"""Documentation every sparkops module repeats: what its attributes mean, and the read-only case."""

from __future__ import annotations


class ModuleDocFragment:
    # What each attribute means; every module states its own support (or uses READ_ONLY).
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in check mode and return what it would change without changing the target.
  diff_mode:
    description: Returns details on what has changed (or would change in check mode) in diff mode.
"""

    # Facts, probes and parsers: they only read, so check mode runs them in full and there is no diff.
    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
    details: Runs in check mode too; it only reads, so running it changes nothing.
  diff_mode:
    support: none
    details: Changes nothing, so there is nothing to show.
"""
