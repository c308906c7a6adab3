"""The stand-in build-and-copy.sh accepts exactly the grammar of eugr/spark-vllm-docker@fc08740
(build-and-copy.sh:297-364) and resolves the versions a real build of those refs would carry.
Run with --no-build: parsing and version resolution only, no Docker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import image_versions as iv

STANDIN = Path(__file__).resolve().parents[3] / "sim" / "standin"
SCRIPT = STANDIN / "build-and-copy.sh"
# 2026-04-10 12:00 UTC, the day eugr's fc08740 was committed: setuptools-scm honours SOURCE_DATE_EPOCH.
EPOCH = "1775822400"


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, "SOURCE_DATE_EPOCH": EPOCH, **(env or {})},
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--use-wheels", "release"],  # the old pin's arguments: --use-wheels is gone at fc08740
        ["--use-wheels"],
        ["--torch-version", "2.10.0"],  # only from 896dd7a (2026-07-14)
        ["--pre-flashinfer"],
        ["release"],
    ],
)
def test_flags_the_real_script_does_not_know_are_refused(args):
    res = run(*args, "--no-build")
    assert res.returncode == 1
    assert f"Unknown parameter passed: {args[0]}" in res.stdout
    assert "Usage:" in res.stdout


@pytest.mark.parametrize("flag", ["--apply-vllm-pr", "--apply-flashinfer-pr", "--network"])
def test_value_flags_refuse_a_missing_or_dash_value(flag):
    assert run(flag).returncode == 1
    assert run(flag, "--no-build").returncode == 1


def test_help_exits_1_like_the_real_usage():
    assert run("-h").returncode == 1
    assert run("--help").returncode == 1


def test_pinned_arguments_resolve_to_the_dirty_tree_version_eugrs_build_reports():
    """A dirty tree at tag v0.19.0 (commit 2a69949bd), CUDA 13.2: issue 22's string, not a clean 0.19.0."""
    res = run("--vllm-ref", "v0.19.0", "--flashinfer-ref", "v0.6.6", "--no-build")
    assert res.returncode == 0, res.stderr
    assert (
        "vLLM 0.19.1.dev0+g2a69949bd.d20260410.cu132 (--vllm-ref v0.19.0), FlashInfer 0.6.6 (--flashinfer-ref v0.6.6)"
        in res.stderr
    )
    assert "Skipping build (--no-build specified)" in res.stdout


def test_the_stand_in_version_is_accepted_by_the_shipped_commit_pin_and_has_eugrs_shape():
    res = run("--vllm-ref", "v0.19.0", "--no-build")
    version = res.stderr.split("vLLM ", 1)[1].split(" ", 1)[0]
    # the same shape as eugr's prebuilt wheels (issue 22: 0.16.1rc1.dev296+ga73af584f.d20260305.cu131)
    assert iv.vllm_commit(version) == "2a69949bd"
    assert version.split("+", 1)[1].split(".")[1:] == ["d20260410", "cu132"]
    pins = {"vllm": "0.19.0", "vllm_commit": "2a69949bd"}
    assert iv.compare_versions({"vllm": version}, pins) == []


def test_the_date_label_is_the_build_day_in_utc():
    res = run("--vllm-ref", "v0.19.0", "--no-build", env={"SOURCE_DATE_EPOCH": "1775865600"})  # 2026-04-11 00:00Z
    assert "+g2a69949bd.d20260411.cu132" in res.stderr


def test_a_tag_without_a_recorded_commit_is_refused():
    res = run("--vllm-ref", "v0.18.0", "--no-build")
    assert res.returncode == 1
    assert "no commit recorded for vLLM tag v0.18.0" in res.stderr


def test_without_pins_the_build_gets_main_of_the_build_day():
    res = run("--no-build")
    assert res.returncode == 0, res.stderr
    assert "vLLM 0.20.1.dev42+g1a2b3c4d5.d20260410.cu132 (--vllm-ref main)" in res.stderr


def test_the_stand_in_dist_reports_one_version_on_every_path(tmp_path):
    """make_standin_dists.py's vllm: importlib.metadata (what `vllm --version` prints, cli/main.py:61),
    vllm.__version__ (/version and the start-up line) and the image probe's commit agree, and the test
    double's `vllm --version` prints it."""
    version = "0.19.1.dev0+g2a69949bd.d20260410.cu132"
    site = tmp_path / "site"
    site.mkdir()
    make = (
        "import sys, sysconfig; site = sys.argv[1]; sysconfig.get_paths = lambda: {'purelib': site}; "
        "sys.argv = sys.argv[1:]; "
        f"exec(compile(open({str(STANDIN / 'make_standin_dists.py')!r}).read(), 'make_standin_dists.py', 'exec'))"
    )
    subprocess.run(
        [sys.executable, "-c", make, str(site), version, "2a69949bd", "0.6.6", "2.12.0.dev20260410+cu130", "2.29.7"],
        check=True,
        timeout=60,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run(
        [sys.executable, "-c", iv.PROBE], capture_output=True, text=True, check=True, env=env, timeout=60
    )
    found = iv.parse_probe_output(probe.stdout)
    assert found["vllm"] == version and found["vllm_commit"] == "2a69949bd"
    imported = subprocess.run(
        [sys.executable, "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    )
    assert imported.stdout.strip() == version
    double = subprocess.run(
        [sys.executable, str(STANDIN / "vllm_test_double.py"), "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert double.returncode == 0, double.stderr
    assert double.stdout.strip() == version


def test_every_other_flag_of_the_real_grammar_is_accepted():
    res = run(
        "-t", "x", "--gpu-arch", "12.1a", "--rebuild-flashinfer", "--rebuild-vllm", "-j", "8", "-u", "me",
        "--copy-parallel", "--tf5", "--exp-mxfp4", "--apply-vllm-pr", "123", "--apply-flashinfer-pr", "45",
        "--full-log", "--cleanup", "--network", "host", "--config", ".env", "--setup",
        "-c", "h1", "h2,h3", "--no-build",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    assert "not copying to h1 h2,h3" in res.stderr


def test_a_ref_the_stand_in_cannot_know_is_refused():
    res = run("--vllm-ref", "deadbeef", "--no-build")
    assert res.returncode == 1
    assert "neither main nor a release tag" in res.stderr


def test_the_stand_in_image_passes_the_compiled_code_check(tmp_path):
    """The image role loads vLLM's extensions and FlashInfer's compiled modules after a build
    (module_utils/image_compiled.py); the stand-in's Python extensions and empty AOT folder pass it."""
    from ansible_collections.sparkops.cluster.plugins.module_utils import image_compiled as ic  # noqa: PLC0415

    site = tmp_path / "site"
    site.mkdir()
    make = (
        "import sys, sysconfig; site = sys.argv[1]; sysconfig.get_paths = lambda: {'purelib': site}; "
        "sys.argv = sys.argv[1:]; "
        f"exec(compile(open({str(STANDIN / 'make_standin_dists.py')!r}).read(), 'make_standin_dists.py', 'exec'))"
    )
    version = "0.19.1.dev0+g2a69949bd.d20260410.cu132"
    subprocess.run(
        [sys.executable, "-c", make, str(site), version, "2a69949bd", "0.6.6", "2.12.0.dev20260410+cu130", "2.29.7"],
        check=True,
        timeout=60,
    )
    probe = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); exec({ic.PROBE!r})"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    found = ic.parse_output(probe.stdout)
    assert ic.problems(found) == [], found
    assert set(found["vllm"]) == {"vllm._C", "vllm._C_stable_libtorch"} and found["flashinfer_loaded"] == 0
