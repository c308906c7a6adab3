"""image_build: the build's output goes to a log on the node, its status to <log>.rc, a failure says where."""

from __future__ import annotations

import time

from ansible_collections.sparkops.cluster.plugins.modules import image_build
from module_runner import run_module


def script(tmp_path, body: str) -> str:
    path = tmp_path / "build-and-copy.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_output_is_logged_and_the_status_written(tmp_path):
    build = script(tmp_path, 'echo "vLLM build command: docker build --target vllm-export ."\necho "arg=$1"\n')
    log = tmp_path / "logs" / "image-build.log"
    res = run_module(image_build, {"argv": [build, "it's; touch PWNED"], "chdir": str(tmp_path), "log_path": str(log)})
    assert not res.get("failed"), res.get("msg")
    assert res["rc"] == 0 and res["changed"]
    assert "arg=it's; touch PWNED" in log.read_text()  # one argv word, never a shell
    assert not (tmp_path / "PWNED").exists()
    assert (tmp_path / "logs" / "image-build.log.rc").read_text().strip() == "0"


def test_failure_names_the_stage_the_last_lines_and_the_log(tmp_path):
    build = script(
        tmp_path,
        'echo "vLLM build command: docker build --target vllm-export ."\n'
        'echo "#14 [vllm-builder 7/9] RUN uv build --no-build-isolation --wheel ."\n'
        "echo '#14 ERROR: process \"/bin/sh -c uv build\" did not complete successfully: exit code: 1' >&2\n"
        "exit 3\n",
    )
    log = tmp_path / "b.log"
    res = run_module(image_build, {"argv": [build], "chdir": str(tmp_path), "log_path": str(log), "tail_lines": 2})
    assert res["failed"] and res["rc"] == 3
    assert "The image build failed (exit 3)" in res["msg"]
    assert "in vLLM, step vllm-builder 7/9" in res["msg"]
    assert f"Full log: {log}" in res["msg"]
    assert res["msg"].endswith('#14 ERROR: process "/bin/sh -c uv build" did not complete successfully: exit code: 1')
    assert (tmp_path / "b.log.rc").read_text().strip() == "3"


def test_timeout_kills_the_build_and_its_children(tmp_path):
    build = script(tmp_path, "sleep 30 &\nsleep 30\n")
    log = tmp_path / "b.log"
    start = time.monotonic()
    res = run_module(image_build, {"argv": [build], "chdir": str(tmp_path), "log_path": str(log), "timeout_s": 1})
    assert time.monotonic() - start < 20
    assert res["failed"] and res["rc"] == 124
    assert "ran longer than 1 s and was stopped" in log.read_text()


def test_a_stale_status_file_is_removed_before_the_build(tmp_path):
    log = tmp_path / "b.log"
    (tmp_path / "b.log.rc").write_text("0\n")
    build = script(tmp_path, f"test -e {log}.rc && echo STALE\nexit 0\n")
    run_module(image_build, {"argv": [build], "chdir": str(tmp_path), "log_path": str(log)})
    assert "STALE" not in log.read_text()


def test_check_mode_runs_nothing(tmp_path):
    build = script(tmp_path, f"touch {tmp_path}/ran\n")
    log = tmp_path / "b.log"
    res = run_module(image_build, {"argv": [build], "chdir": str(tmp_path), "log_path": str(log)}, check_mode=True)
    assert res["changed"] and not (tmp_path / "ran").exists() and not log.exists()


def test_bad_input_is_refused_clearly(tmp_path):
    res = run_module(image_build, {"argv": [], "chdir": str(tmp_path), "log_path": str(tmp_path / "l")})
    assert res["failed"] and "argv is empty" in res["msg"]
    res = run_module(image_build, {"argv": ["true"], "chdir": str(tmp_path / "nope"), "log_path": str(tmp_path / "l")})
    assert res["failed"] and "is not a folder" in res["msg"]
    res = run_module(
        image_build, {"argv": ["/nonexistent/build"], "chdir": str(tmp_path), "log_path": str(tmp_path / "l")}
    )
    assert res["failed"] and res["rc"] == 127
