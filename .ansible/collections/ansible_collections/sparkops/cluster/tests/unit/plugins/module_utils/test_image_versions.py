"""image_versions: the in-image probe, its parser and the pin/lock comparison."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import image_versions as iv

PINS = {"vllm": "0.19.0", "flashinfer": "0.6.6", "cuda": "13.2", "ray": "2.52.1", "torch": None, "nccl": None}
FOUND = {
    "vllm": "0.19.0+cu132",
    "torch": "2.12.0.dev20260410+cu130",
    "cuda": "13.2.0",
    "flashinfer": "0.6.6",
    "ray": "2.52.1",
    "nccl": "2.28.9",
}


@pytest.mark.parametrize(
    ("pin", "found", "ok"),
    [
        ("0.19.0", "0.19.0", True),
        ("0.19.0", "0.19.0+cu132", True),  # vLLM's setup.py labels a non-default CUDA build
        ("13.2", "13.2.0", True),
        ("13.2", "13.2.1", True),
        ("0.19.0", "0.19.0.dev5", False),  # a dev build of main is not the release
        ("0.19.0", "0.19.0rc1", False),
        ("0.19.0", "0.19.1", False),
        ("0.19", "0.19.0", True),
        ("0.19.0", "0.12.0", False),
        ("2.52.1", "2.52.10", False),
        ("13.2", "13.20.0", False),
        ("0.19.0", None, False),
    ],
)
def test_version_matches(pin, found, ok):
    assert iv.version_matches(pin, found) is ok


def test_image_built_as_pinned_has_no_problems():
    assert iv.compare_versions(FOUND, PINS) == []


def test_unpinned_vllm_build_is_refused_naming_both_versions():
    found = {**FOUND, "vllm": "0.20.1.dev42+g1234abcd"}
    problems = iv.compare_versions(found, PINS)
    assert problems == ["vllm: the image carries 0.20.1.dev42+g1234abcd, the pin (sparkops_image_pins.vllm) is 0.19.0"]


def test_missing_component_is_a_problem():
    found = {**FOUND, "flashinfer": None}
    (problem,) = iv.compare_versions(found, PINS)
    assert problem.startswith("flashinfer: the image carries none, the pin")


def test_lock_is_compared_exactly_for_unpinned_components():
    locked = {"torch": "2.12.0.dev20260410+cu130", "nccl": "2.28.9"}
    assert iv.compare_versions(FOUND, PINS, locked) == []
    rebuilt = {**FOUND, "torch": "2.12.0.dev20260501+cu130"}
    assert iv.compare_versions(rebuilt, PINS, locked) == [
        "torch: the image carries 2.12.0.dev20260501+cu130, the lock file recorded 2.12.0.dev20260410+cu130"
    ]


def test_unknown_pin_component_is_reported():
    problems = iv.compare_versions(FOUND, {**PINS, "triton": "3.6.0"})
    assert problems and "triton" in problems[-1]


def test_parse_probe_output_takes_the_marker_line_among_noise():
    out = "WARNING something\n" + iv.MARKER + json.dumps(FOUND) + "\n"
    assert iv.parse_probe_output(out) == FOUND
    with pytest.raises(ValueError, match="no versions line"):
        iv.parse_probe_output("Traceback ...\n")
    with pytest.raises(ValueError, match="not JSON"):
        iv.parse_probe_output(iv.MARKER + "{broken\n")


def test_probe_runs_for_real_and_reads_installed_wheels(tmp_path):
    """The probe is run by a real python3 (here the test's own) and reports what importlib.metadata sees."""
    res = subprocess.run(
        [sys.executable, "-c", iv.PROBE], capture_output=True, text=True, check=True, env={"CUDA_VERSION": "13.2.0"}
    )
    found = iv.parse_probe_output(res.stdout)
    assert set(iv.COMPONENTS) <= set(found)
    assert found["cuda"] == "13.2.0"
    for comp, dist in (("ray", "ray"), ("torch", "torch"), ("vllm", "vllm")):
        try:
            expected = md.version(dist)
        except md.PackageNotFoundError:
            expected = None
        assert found[comp] == expected
