"""build_log: where an eugr/spark-vllm-docker build is, from its log's end.

The lines are eugr's real ones: build-and-copy.sh@fc08740's phase lines (:514, :555, :581, :621, :664),
BuildKit's plain steps for Dockerfile@fc08740's stages (base :9, flashinfer-builder :83, vllm-builder :164,
runner :266), and the terminal view users pasted in eugr/spark-vllm-docker issues 167 and 243.
"""

from __future__ import annotations

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import build_log as bl

FI_PHASE = [
    "Rebuilding FlashInfer wheels (--flashinfer-ref specified)...",
    "FlashInfer build command: docker build --target flashinfer-export --output type=local,dest=./wheels "
    "--build-arg FLASHINFER_REF=v0.6.6 --build-arg CACHEBUST_FLASHINFER=1775822400 .",
    "#1 [internal] load build definition from Dockerfile",
    "#1 DONE 0.0s",
    "#9 [flashinfer-builder 2/7] RUN --mount=type=cache,id=repo-cache,target=/repo-cache     cd /repo-cache && "
    '    if [ ! -d "flashinfer" ]; then         echo "Cache miss: Cloning FlashInfer from scratch..." &&',
    "#9 0.412 Cache miss: Cloning FlashInfer from scratch...",
]
VLLM_PHASE = [
    "Rebuilding vLLM wheels (--vllm-ref specified)...",
    "vLLM build command: docker build --target vllm-export --output type=local,dest=./wheels "
    "--build-arg VLLM_REF=v0.19.0 --build-arg CACHEBUST_VLLM=1775824000 .",
    "#14 [vllm-builder 7/9] RUN --mount=type=cache,id=ccache,target=/root/.ccache     "
    "--mount=type=cache,id=uv-cache,target=/root/.cache/uv     uv build --no-build-isolation --wheel . "
    "--out-dir=/workspace/wheels -v &&     git rev-parse HEAD > /workspace/wheels/.vllm-commit",
    "#14 1532.7 [412/1006] Building CUDA object CMakeFiles/_C.dir/csrc/attention/paged_attention_v1.cu.o",
]
# eugr/spark-vllm-docker issue 243 (2026-05-15), the terminal view of the runner build.
RUNNER_PHASE = [
    "Generated build-metadata.yaml",
    "Building runner image with command: docker build -t vllm-node --build-arg BUILD_JOBS=16 "
    "--build-arg TORCH_CUDA_ARCH_LIST=12.1a --build-arg FLASHINFER_CUDA_ARCH_LIST=12.1a .",
    "[+] Building 3.8s (16/19)                                        docker:default",
    " => [internal] load build definition from Dockerfile                       0.0s",
    " => [base 1/5] FROM docker.io/nvidia/cuda:13.2.0-devel-ubuntu24.04@sha256  0.0s",
    " => CACHED [base 2/5] RUN apt update &&     apt install -y --no-install-r  0.0s",
]
# eugr/spark-vllm-docker issue 167 (2026-04-08): a vLLM PR patch that no longer applies.
VLLM_ERROR = [
    " => ERROR [vllm-builder 5/8] RUN curl -fsL https://patch-diff.githubusercontent.com/raw/vllm-project/vllm/"
    "pull/35568.diff -o pr35568.diff     && if git apply --reverse --check pr3  0.6s",
    "------",
    " > [vllm-builder 5/8] RUN curl -fsL https://patch-diff.githubusercontent.com/raw/vllm-project/vllm/pull/"
    "35568.diff -o pr35568.diff     && if git apply --reverse --check pr35568.diff 2>/dev/null; then ...:",
    "0.567 Applying PR 35568...",
    "0.568 error: csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm.cuh: No such file or directory",
    "vLLM build failed — restoring previous wheels...",
]


def text(*parts):
    return "\n".join(line for part in parts for line in part) + "\n"


def test_flashinfer_phase_and_its_step():
    st = bl.build_stage(text(FI_PHASE))
    assert st["phase"] == "FlashInfer"
    assert st["step"] == "flashinfer-builder 2/7"
    assert st["instruction"].startswith("RUN --mount=type=cache,id=repo-cache")
    assert st["error"] is None


def test_vllm_phase_follows_flashinfer():
    st = bl.build_stage(text(FI_PHASE, VLLM_PHASE))
    assert (st["phase"], st["step"]) == ("vLLM", "vllm-builder 7/9")


def test_runner_phase_keeps_its_name_while_running_base_steps():
    st = bl.build_stage(text(FI_PHASE, VLLM_PHASE, RUNNER_PHASE))
    assert st["phase"] == "runner image"
    assert st["step"] == "base 2/5"
    assert st["instruction"] == "RUN apt update && apt install -y --no-install-r"  # the view's "0.0s" dropped


def test_a_phase_line_clears_the_previous_phase_step():
    st = bl.build_stage(text(VLLM_PHASE, RUNNER_PHASE[:2]))
    assert (st["phase"], st["step"]) == ("runner image", None)


@pytest.mark.parametrize(
    ("line", "phase", "step"),
    [
        ("#5 [base 3/5] RUN --mount=type=cache,id=uv-cache,target=/root/.cache/uv", "base image (CUDA, NCCL)",
         "base 3/5"),
        ("#21 [runner 9/12] RUN --mount=type=bind,source=wheels,target=/workspace/wheels", "runner image",
         "runner 9/12"),
        (" => [vllm-builder 2/9] RUN --mount=type=cache,id=repo-cache  12.3s", "vLLM", "vllm-builder 2/9"),
        ("#4 [ 1/10] FROM nvcr.io/nvidia/cuda:12.1.0-devel-ubuntu22.04@sha256:e3a8", None, "1/10"),
    ],
)  # fmt: skip
def test_stage_names_without_a_phase_line(line, phase, step):
    st = bl.build_stage(line + "\n")
    assert (st["phase"], st["step"]) == (phase, step)


def test_the_error_line_and_failure_message():
    log = text(FI_PHASE, VLLM_PHASE[:2], VLLM_ERROR)
    st = bl.build_stage(log)
    assert st["phase"] == "vLLM" and st["step"] == "vllm-builder 5/8"
    assert st["error"].startswith("=> ERROR [vllm-builder 5/8] RUN curl")
    msg = bl.failure_message(log, 1, 754, "/var/lib/sparkops/logs/image-build.log", count=3)
    assert msg.startswith("The image build failed (exit 1) after 12 min 34 s in vLLM, step vllm-builder 5/8 (RUN curl")
    assert "Full log: /var/lib/sparkops/logs/image-build.log. Its last 3 lines:" in msg
    assert msg.endswith(
        "0.567 Applying PR 35568...\n"
        "0.568 error: csrc/libtorch_stable/quantization/w8a8/cutlass/c3x/scaled_mm.cuh: No such file or directory\n"
        "vLLM build failed — restoring previous wheels..."
    )


def test_progress_message():
    msg = bl.progress_message(text(FI_PHASE, VLLM_PHASE), 3725, "/l.log")
    assert msg.startswith("building vLLM (step vllm-builder 7/9: RUN --mount=type=cache,id=ccache")
    assert msg.endswith(", 1 h 02 min in; full log /l.log")
    assert bl.progress_message("", 5, "/l.log") == "building starting, 5 s in; full log /l.log"


@pytest.mark.parametrize(
    ("s", "out"),
    [(0, "0 s"), (59, "59 s"), (60, "1 min 00 s"), (3599, "59 min 59 s"), (3600, "1 h 00 min"), (-3, "0 s")],
)
def test_elapsed_text(s, out):
    assert bl.elapsed_text(s) == out


def test_tail_lines_skips_blanks_and_keeps_the_last():
    assert bl.tail_lines("a\n\nb\r\nc\n", 2) == ["b", "c"]
    assert bl.tail_lines("a\nb\n", 0) == []


def test_watch_output_round_trip(tmp_path):
    import subprocess

    log = tmp_path / "build log's.log"  # a space and a quote: the path is one argv word
    log.write_text(text(VLLM_PHASE))
    out = subprocess.run(bl.watch_command(str(log)), capture_output=True, text=True, check=True).stdout
    body, rc = bl.parse_watch_output(out)
    assert rc is None and bl.build_stage(body)["step"] == "vllm-builder 7/9"
    (tmp_path / "build log's.log.rc").write_text("2\n")
    out = subprocess.run(bl.watch_command(str(log)), capture_output=True, text=True, check=True).stdout
    assert bl.parse_watch_output(out)[1] == 2
    assert bl.parse_watch_output("no marker") == ("no marker", None)


def test_a_finished_build_is_seen_through_a_terminal(tmp_path):
    """Over SSH Ansible runs the watch under a terminal, which sends CRLF line ends: the simulated
    cluster's first run polled a build that had finished for minutes, as if it still ran."""
    import subprocess

    log = tmp_path / "image-build.log"
    log.write_text(text(VLLM_PHASE))
    (tmp_path / "image-build.log.rc").write_text("0\n")
    out = subprocess.run(bl.watch_command(str(log)), capture_output=True, text=True, check=True).stdout
    body, rc = bl.parse_watch_output(out.replace("\n", "\r\n"))
    assert rc == 0 and bl.build_stage(body)["step"] == "vllm-builder 7/9"


def test_an_earlier_builds_status_is_not_this_runs(tmp_path):
    """The build starts in the background; the first poll can come before it has removed the status file
    an earlier build left (the simulated cluster's upgrade read "built in 0 s" and then found no image)."""
    import subprocess

    log = tmp_path / "image-build.log"
    log.write_text(text(VLLM_PHASE))
    (tmp_path / "image-build.log.rc").write_text("0 1795570000.0\n")  # the earlier run's
    out = subprocess.run(bl.watch_command(str(log)), capture_output=True, text=True, check=True).stdout
    assert bl.parse_watch_output(out, "1795570100.5")[1] is None  # still running, as far as this run knows
    assert bl.parse_watch_output(out, "1795570000.0")[1] == 0
    assert bl.parse_watch_output(out)[1] == 0  # no run id asked: any status (a watch started by hand)
    (tmp_path / "image-build.log.rc").write_text("3 1795570100.5\n")
    out = subprocess.run(bl.watch_command(str(log)), capture_output=True, text=True, check=True).stdout
    assert bl.parse_watch_output(out, "1795570100.5")[1] == 3
