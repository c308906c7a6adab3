"""The vLLM test double speaks the release its image carries (sim/standin/vllm_test_double.py).

The stand-in image of a stack holds a metadata-only `vllm` dist of that stack's release
(sim/standin/make_standin_dists.py); the double reads it (importlib.metadata, as `vllm --version` does)
and loads that release's recorded contract and start-up lines. Here the dist is written into a folder on
PYTHONPATH, and the double is started on loopback as vLLM 0.33.0, as vLLM's own image of the stack reports.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from double_fixtures import MODEL, free_port, tiny_hf_home

ROOT = Path(__file__).resolve().parents[3]
DOUBLE = ROOT / "sim" / "standin" / "vllm_test_double.py"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    return tiny_hf_home(tmp_path_factory.mktemp("hf"))


def image_of(tmp: Path, version: str | None) -> dict:
    """The environment of a stand-in image whose vLLM reports `version` (None: no vLLM dist, the recorded
    default release), with the tiny model's cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKOPS_TEST_DOUBLE", "HF_", "VLLM_"))}
    if version:
        site = tmp / f"site-{version}"
        info = site / f"vllm-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        env["PYTHONPATH"] = str(site)
    return env | {"PYTHONUNBUFFERED": "1", "SPARKOPS_TEST_DOUBLE_TOK_S": "40", "VLLM_CACHE_ROOT": str(tmp / "vc")}


def run(args: list, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(DOUBLE), *args], env=env, capture_output=True, text=True, check=False, timeout=60
    )


def serve(args: list, env: dict, logf: Path, port: int) -> tuple[subprocess.Popen, str]:
    with logf.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(DOUBLE), "serve", MODEL, "--host", "127.0.0.1", "--port", str(port), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, logf.read_text()
        try:
            with urllib.request.urlopen(base + "/health", timeout=1) as r:  # noqa: S310 (loopback)
                if r.status == 200:
                    return proc, base
        except OSError:
            time.sleep(0.2)
    stop(proc)
    pytest.fail("the double did not answer /health:\n" + logf.read_text())


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_double_started_as_0_33_0_reports_it_and_prints_0_33_0_s_start_up_lines(hf_home, tmp_path):
    env = image_of(tmp_path, "0.33.0") | {"HF_HOME": str(hf_home)}
    assert run(["--version"], env).stdout.strip() == "0.33.0"
    port, logf = free_port(), tmp_path / "double.log"
    # --no-enable-prefix-caching: hidden from 0.33.0's help, still registered (argparse_utils.py:148-152)
    proc, base = serve(["--no-enable-prefix-caching"], env, logf, port)
    try:
        with urllib.request.urlopen(base + "/version", timeout=5) as r:  # noqa: S310 (loopback)
            assert json.loads(r.read())["version"] == "0.33.0"
    finally:
        stop(proc)
    log = logf.read_text()
    # vllm/entrypoints/common/startup.py:16-19 and launchers/api_server/entry.py:139 of the 0.33.0 wheel
    assert f"vLLM server version 0.33.0, serving model {MODEL}" in log, log
    assert f"Starting vLLM server on http://127.0.0.1:{port}" in log, log
    assert "vLLM API server version" not in log and "Starting vLLM API server 0" not in log
    assert '"enable_prefix_caching": false' in log  # the non-default args line names it
    assert log.index("Starting vLLM server on") < log.index("Application startup complete.")


def test_0_33_0_refuses_the_flag_it_removed_and_the_default_release_takes_it(hf_home, tmp_path):
    """--calculate-kv-scales: vllm/engine/arg_utils.py:1007 of 0.19.0; absent from 0.33.0's arg_utils.py."""
    new = run(["serve", MODEL, "--calculate-kv-scales"], image_of(tmp_path, "0.33.0") | {"HF_HOME": str(hf_home)})
    assert new.returncode == 2, new.stdout + new.stderr
    assert "unrecognized arguments: --calculate-kv-scales" in new.stderr
    old = run(["--version"], image_of(tmp_path, None))
    assert old.returncode == 0 and old.stdout.strip() == "0.19.0"
    sys.path.insert(0, str(DOUBLE.parent))
    try:
        import vllm_test_double as d
    finally:
        sys.path.pop(0)
    default = json.loads(d.contract_file("0.19.0").read_text())
    args = d.build_parser(default).parse_args(d.flexible(["serve", MODEL, "--calculate-kv-scales"]))
    assert args.calculate_kv_scales is True
    assert d.startup_lines(default) == d.DEFAULT_STARTUP_LINES


def test_the_default_release_keeps_its_start_up_lines(hf_home, tmp_path):
    env = image_of(tmp_path, None) | {"HF_HOME": str(hf_home)}
    port, logf = free_port(), tmp_path / "double.log"
    proc, _base = serve([], env, logf, port)
    stop(proc)
    log = logf.read_text()
    assert "vLLM API server version 0.19.0 (TEST DOUBLE, not vLLM)" in log
    assert f"Starting vLLM API server 0 on http://127.0.0.1:{port}" in log and "vLLM server version" not in log
