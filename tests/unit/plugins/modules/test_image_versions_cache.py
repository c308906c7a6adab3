"""image_versions with cache_dir: the probe container runs once per image ID, the pins are compared every run.

`docker` is a fake executable (a shell script) that logs its calls and answers `image inspect` with an ID
from a file and `run` with the probe's versions line.
"""

from __future__ import annotations

import json

from ansible_collections.sparkops.cluster.plugins.modules import image_versions
from module_runner import run_module

ID_A = "sha256:" + "a" * 64
ID_B = "sha256:" + "b" * 64
# Every key the probe prints (module_utils/image_versions.py PROBE), eugr's dirty build of v0.19.0.
VERSIONS = {
    "vllm": "0.19.1.dev0+g2a69949bd.d20260410.cu132",
    "vllm_commit": "g2a69949bd",
    "torch": "2.12.0",
    "cuda": "13.2.0",
    "flashinfer": "0.6.6",
    "flashinfer_commit": None,
    "flashinfer_cutlass": "4.2.1+sha256:2666672a2db624fd",
    "ray": "2.52.1",
    "nccl": None,
}


def fake_docker(tmp_path, image_id=ID_A, versions=None, help_rc=0):
    (tmp_path / "id").write_text(image_id)
    line = "SPARKOPS-IMAGE-VERSIONS " + json.dumps(versions or VERSIONS)
    (tmp_path / "line").write_text(line + "\n")
    script = tmp_path / "docker"
    # `run ... --entrypoint sh IMAGE -c SCRIPT` is the options' question: the fake runs SCRIPT with a
    # `vllm` and a `python3` of its own on PATH, so the marker and the exit status come from the
    # module's own script.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(
        f"#!/bin/sh\necho 'usage: vllm serve [--max-model-len MAX_MODEL_LEN]'\nexit {help_rc}\n"
    )
    (bin_dir / "python3").write_text("#!/bin/sh\necho VLLM_API_KEY\necho VLLM_HOST_IP\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$1 $2" >> {tmp_path}/calls\n'
        f'if [ "$1" = image ]; then cat {tmp_path}/id; echo; exit 0; fi\n'
        'prev=; for a in "$@"; do [ "$prev" = --entrypoint ] && [ "$a" = sh ] && ep=1; prev=$a; done\n'
        'if [ "$1" = run ] && [ -n "$ep" ]; then\n'
        '  for a in "$@"; do case "$a" in SPARKOPS_ENVS_MARKER=*) export "$a";; esac; done\n'
        '  while [ "$1" != "-c" ]; do shift; done\n'
        f'  echo "run help" >> {tmp_path}/calls; PATH={bin_dir}:$PATH exec sh -c "$2"\n'
        "fi\n"
        f'if [ "$1" = run ]; then cat {tmp_path}/line; exit 0; fi\n'
        "exit 2\n"
    )
    script.chmod(0o755)
    return str(script)


def calls(tmp_path):
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def run(tmp_path, docker, **args):
    return run_module(
        image_versions, {"image": "vllm-node:abc", "docker": docker, "cache_dir": str(tmp_path / "cache"), **args}
    )


def test_the_probe_runs_once_per_image_id(tmp_path):
    docker = fake_docker(tmp_path)
    first = run(tmp_path, docker)
    assert not first.get("failed") and first["versions"]["vllm"] == VERSIONS["vllm"]
    assert first["cached"] is False and first["image_id"] == ID_A
    assert [c for c in calls(tmp_path) if c.startswith("run")] == ["run --rm"]
    cached = json.loads((tmp_path / "cache" / f"image-versions-{'a' * 64}.json").read_text())
    assert cached["ray"] == "2.52.1"

    second = run(tmp_path, docker)
    assert second["cached"] is True and second["versions"] == first["versions"]
    assert [c for c in calls(tmp_path) if c.startswith("run")] == ["run --rm"], (
        "a cached image ID must not start a container"
    )

    # A new image under the same tag is a new ID: probed again.
    (tmp_path / "id").write_text(ID_B)
    third = run(tmp_path, docker)
    assert third["cached"] is False and third["image_id"] == ID_B
    assert len([c for c in calls(tmp_path) if c.startswith("run")]) == 2


def test_pins_are_compared_on_a_cached_reading(tmp_path):
    docker = fake_docker(tmp_path)
    run(tmp_path, docker)
    res = run(tmp_path, docker, pins={"vllm": "0.20.0"})
    assert res["failed"] and res["cached"] is True
    assert "vllm" in res["msg"] and "0.20.0" in res["msg"] and VERSIONS["vllm"] in res["msg"]


def test_an_unreadable_cache_file_is_probed_again_and_rewritten(tmp_path):
    docker = fake_docker(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    bad = cache / f"image-versions-{'a' * 64}.json"
    bad.write_text('{"vllm": "9.9.9"}')  # not every component: not trusted
    res = run(tmp_path, docker)
    assert res["cached"] is False and res["versions"]["vllm"] == VERSIONS["vllm"]
    assert json.loads(bad.read_text())["vllm"] == VERSIONS["vllm"]


def test_a_cache_file_of_the_older_probe_is_probed_again(tmp_path):
    """A file written before the probe read the commits and flashinfer_cutlass lacks them: read the image again."""
    docker = fake_docker(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir()
    old = cache / f"image-versions-{'a' * 64}.json"
    old.write_text(json.dumps({k: VERSIONS[k] for k in ("vllm", "torch", "cuda", "flashinfer", "ray", "nccl")}))
    res = run(tmp_path, docker)
    assert res["cached"] is False
    assert json.loads(old.read_text())["flashinfer_cutlass"] == VERSIONS["flashinfer_cutlass"]


def test_the_dirty_build_of_the_pinned_commit_passes_and_is_recorded_exactly(tmp_path):
    docker = fake_docker(tmp_path)
    res = run(tmp_path, docker, pins={"vllm": "0.19.0", "vllm_commit": "2a69949bd"})
    assert not res.get("failed"), res.get("msg")
    assert res["record"]["vllm"] == "0.19.1.dev0+g2a69949bd.d20260410.cu132"
    assert res["record"]["vllm_commit"] == "2a69949bd"
    assert "nccl_error" not in res["record"]
    other = run(tmp_path, docker, pins={"vllm": "0.19.0", "vllm_commit": "1a2b3c4d5"})
    assert other["failed"] and "commit 2a69949bd" in other["msg"] and "commit 1a2b3c4d5" in other["msg"]


def test_an_image_missing_on_the_node_fails_with_what_to_do(tmp_path):
    docker = fake_docker(tmp_path, image_id="")
    res = run(tmp_path, docker)
    assert res["failed"] and "not on this host" in res["msg"] and "image.yml" in res["msg"]
    assert not any(c.startswith("run") for c in calls(tmp_path))


def test_check_mode_writes_no_cache(tmp_path):
    docker = fake_docker(tmp_path)
    res = run_module(
        image_versions,
        {"image": "vllm-node:abc", "docker": docker, "cache_dir": str(tmp_path / "cache")},
        check_mode=True,
    )
    assert not res.get("failed") and res["cached"] is False
    assert not (tmp_path / "cache").exists()


def test_vllm_options_are_asked_once_per_image_id(tmp_path):
    docker = fake_docker(tmp_path)
    first = run(tmp_path, docker, serve_help=True, envs_marker="@@MARK@@")
    assert not first.get("failed"), first
    help_text, names = first["serve_help"].split("@@MARK@@\n")
    assert "--max-model-len" in help_text and names.split() == ["VLLM_API_KEY", "VLLM_HOST_IP"]
    assert first["serve_help_cached"] is False
    assert (tmp_path / "cache" / f"vllm-help-{'a' * 64}.txt").read_text() == first["serve_help"]

    second = run(tmp_path, docker, serve_help=True, envs_marker="@@MARK@@")
    assert second["serve_help_cached"] is True and second["serve_help"] == first["serve_help"]
    assert calls(tmp_path).count("run help") == 1, "a kept answer must not start a container"


def test_a_failing_help_fails_and_is_not_kept(tmp_path):
    docker = fake_docker(tmp_path, help_rc=2)
    res = run(tmp_path, docker, serve_help=True)
    assert res["failed"] and "--help=all" in res["msg"] and "exited 2" in res["msg"]
    assert not (tmp_path / "cache" / f"vllm-help-{'a' * 64}.txt").exists()


def test_without_serve_help_no_options_are_asked(tmp_path):
    docker = fake_docker(tmp_path)
    res = run(tmp_path, docker)
    assert "serve_help" not in res and "run help" not in calls(tmp_path)
