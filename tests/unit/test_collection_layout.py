"""The checkout must resolve as the sparkops.cluster collection."""

import importlib

from conftest import ROOT


def test_collection_link_points_at_repo_root():
    link = ROOT / "collections" / "ansible_collections" / "sparkops" / "cluster"
    assert link.is_symlink()
    assert link.resolve() == ROOT


def test_module_utils_importable_by_fqcn():
    mod = importlib.import_module("ansible_collections.sparkops.cluster.plugins")
    assert mod is not None
