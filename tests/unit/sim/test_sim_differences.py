"""The simulated cluster runs what a user runs: inventory/sim may set only what a user's inventory sets
too, or what sim/differences.yml lists with its reason (the round's first rule)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
SIM_INV = ROOT / "inventory" / "sim"
USER_INV = ROOT / "inventory" / "two-sparks"
DIFFERENCES = yaml.safe_load((ROOT / "sim" / "differences.yml").read_text())
KINDS = {"hardware", "test_bed", "size", "speed"}
# Written by simctl, git-ignored: absent from a fresh clone, so the test reads only tracked files.
GENERATED = {"sim_state.yml"}


def host_vars(hosts_file: Path) -> set:
    """Every variable a hosts.yml sets on a host or a group, at any depth."""
    found: set = set()

    def walk(group: dict) -> None:
        for vars_ in (group.get("hosts") or {}).values():
            found.update(vars_ or {})
        found.update(group.get("vars") or {})
        for child in (group.get("children") or {}).values():
            walk(child or {})

    for group in (yaml.safe_load(hosts_file.read_text()) or {}).values():
        walk(group or {})
    return found


def inventory_vars(inv: Path) -> set:
    names = host_vars(inv / "hosts.yml")
    for f in sorted((inv / "group_vars").rglob("*.yml")):
        if f.name not in GENERATED:
            names.update(yaml.safe_load(f.read_text()) or {})
    return names


def test_inventory_sim_sets_only_what_a_user_sets_or_a_listed_difference():
    user = inventory_vars(USER_INV)
    listed = set(DIFFERENCES["variables"])
    unexplained = sorted(inventory_vars(SIM_INV) - user - listed)
    assert not unexplained, (
        f"inventory/sim overrides {unexplained}, which inventory/two-sparks does not set: run the shipped default, "
        "or list it with its reason in sim/differences.yml"
    )


def test_every_listed_difference_is_still_set_and_has_a_reason():
    sim = inventory_vars(SIM_INV) | {"sparkops_sim_state_dir"}  # the generated file's one variable
    stale = sorted(set(DIFFERENCES["variables"]) - sim)
    assert not stale, f"sim/differences.yml lists {stale}, which inventory/sim no longer sets: drop them"
    for name, entry in DIFFERENCES["variables"].items():
        assert entry["kind"] in KINDS, name
        assert len(entry["reason"]) > 20, name


def test_the_weights_take_the_users_path():
    """The defaults a user's first deployment runs (Hub download, tcp sync) are not overridden."""
    sim = inventory_vars(SIM_INV)
    for name in ("weight_cache_source", "weight_cache_transport", "weight_cache_verify"):
        assert name not in sim, f"inventory/sim must keep the default {name}"


def test_the_generated_state_file_sets_only_the_listed_variable(tmp_path):
    import sys  # noqa: PLC0415

    sys.path.insert(0, str(ROOT / "sim"))
    import simctl  # noqa: PLC0415

    dest = simctl.write_inventory_state(tmp_path / "state", tmp_path / "sim_state.yml")
    assert set(yaml.safe_load(dest.read_text())) <= set(DIFFERENCES["variables"])
