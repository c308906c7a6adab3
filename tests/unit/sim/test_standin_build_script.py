"""The stand-in build-and-copy.sh accepts exactly the grammar of eugr/spark-vllm-docker@fc08740
(build-and-copy.sh:297-364) and resolves the versions a real build of those refs would carry.
Run with --no-build: parsing and version resolution only, no Docker."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "sim" / "standin" / "build-and-copy.sh"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30, check=False)


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


def test_pinned_arguments_resolve_to_the_pinned_versions():
    res = run("--vllm-ref", "v0.19.0", "--flashinfer-ref", "v0.6.6", "--no-build")
    assert res.returncode == 0, res.stderr
    assert "vLLM 0.19.0 (--vllm-ref v0.19.0), FlashInfer 0.6.6 (--flashinfer-ref v0.6.6)" in res.stderr
    assert "Skipping build (--no-build specified)" in res.stdout


def test_without_pins_the_build_gets_main_of_the_build_day():
    res = run("--no-build")
    assert res.returncode == 0, res.stderr
    assert "vLLM 0.20.1.dev42+g1a2b3c4d5 (--vllm-ref main)" in res.stderr


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
