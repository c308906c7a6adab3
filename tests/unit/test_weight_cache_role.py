"""roles/weight_cache: how the download is started (issue 23: the token; issue 22: the Xet cache).

The download itself runs in the serving image (docker), which the unit tests cannot start; the client's
side of both is proven against the real huggingface_hub in tests/system/test_hub_client.py. Here: the
role hands the client a token file and a persistent Xet cache, and the token is on no command line."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "weight_cache"


def tasks(node):
    """Every task dict in a task list, blocks and always included."""
    for task in node or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from tasks(task.get(key))


def download_block():
    doc = yaml.safe_load((ROLE / "tasks" / "source.yml").read_text())
    for task in tasks(doc):
        if task.get("name", "").startswith("Download the model"):
            return task
    raise AssertionError("no 'Download the model' task in source.yml")


def test_the_token_is_on_no_command_line_and_in_no_environment():
    for path in (ROLE / "tasks").glob("*.yml"):
        for task in tasks(yaml.safe_load(path.read_text())):
            env = task.get("environment") or {}
            assert not any("token" in str(v).lower() for v in env.values()), f"{path.name}: {task.get('name')}"
            argv = str((task.get("ansible.builtin.command") or {}).get("argv", ""))
            # HF_TOKEN_PATH names a file; HF_TOKEN (or `-e HF_TOKEN`) would hand over the secret itself.
            assert not re.search(r"HF_TOKEN(?!_PATH)", argv), f"{path.name}: {task.get('name')}: {argv}"
            assert "weight_cache_token'" not in argv and "weight_cache_token " not in argv


def test_the_token_goes_by_a_0600_tmpfs_file_mounted_read_only_and_removed_after():
    block = download_block()
    token_file = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["weight_cache_token_file"]
    assert token_file.startswith("/run/"), "not on tmpfs"
    names = {t["name"]: t for t in tasks(block["block"])}
    write = next(t for n, t in names.items() if n.startswith("Write the token"))
    assert write["ansible.builtin.copy"]["mode"] == "0600" and write["no_log"] is True
    folder = next(t for n, t in names.items() if n.startswith("Create the root-only"))
    assert folder["ansible.builtin.file"]["mode"] == "0700"
    args = block["vars"]["weight_cache_token_args"]
    assert ":/run/secrets/hf_token:ro'" in args and "'HF_TOKEN_PATH=/run/secrets/hf_token'" in args
    removed = [t for t in tasks(block["always"]) if (t.get("ansible.builtin.file") or {}).get("state") == "absent"]
    assert [t["ansible.builtin.file"]["path"] for t in removed] == ["{{ weight_cache_token_file }}"]


def test_the_xet_cache_is_persistent_beside_the_hub_cache():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["weight_cache_xet_dir"] == "{{ sparkops_hf_home }}/xet"
    run = next(t for t in tasks(download_block()["block"]) if "ansible.builtin.command" in t)
    argv = run["ansible.builtin.command"]["argv"]
    assert "weight_cache_xet_dir ~ ':/xet'" in argv and "'HF_XET_CACHE=/xet'" in argv
    # Xet off by default: http_get resumes an interrupted file, xet_get does not (hub_download.py).
    assert defaults["weight_cache_use_xet"] is False
    assert "'HF_HUB_DISABLE_XET=' ~ ('0' if weight_cache_use_xet | bool else '1')" in argv
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    assert any("weight_cache_xet_dir" in ep.get("options", {}) for ep in spec["argument_specs"].values())


def test_every_repository_the_profile_needs_is_downloaded_synced_and_verified():
    """The drafter of a speculative profile goes the model's way: main.yml downloads and syncs, verify.yml
    hashes, each repository of weight_cache_repos (the model, then the drafter), and the per-repository
    task files read the loop's repository, never the profile's model directly."""
    repos = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())["weight_cache_repos"]
    # Every deployment's profile of the serving plan (the lock's commits), each repository once.
    assert " ".join(repos.split()) == (
        "{{ sparkops_cluster.serving.deployments | map(attribute='profile') "
        "| map('sparkops.cluster.serving_weight_repos') | flatten | unique | list }}"
    )
    for entry, files in (("main.yml", {"source.yml", "sync.yml"}), ("verify.yml", {"verify_repo.yml"})):
        looped = set()
        for task in yaml.safe_load((ROLE / "tasks" / entry).read_text()):
            assert task["loop"] == "{{ weight_cache_repos }}", (entry, task["name"])
            assert task["loop_control"]["loop_var"] == "weight_cache_repo", (entry, task["name"])
            looped.add(task["ansible.builtin.include_tasks"])
        assert looped == files, entry
        for name in files:
            text = (ROLE / "tasks" / name).read_text()
            assert "sparkops_profile.model" not in text and "sparkops_profile.revision" not in text, name
            assert "weight_cache_repo.model" in text and "weight_cache_repo.revision" in text, name


def test_the_shipped_eagle3_profile_needs_its_drafter_on_every_node():
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving_profile import weight_repos  # noqa: PLC0415

    profiles = yaml.safe_load(
        (ROOT / "roles" / "sparkops_defaults" / "defaults" / "main" / "serving_profiles.yml").read_text()
    )["sparkops_serving_profiles"]
    assert [r["model"] for r in weight_repos(profiles["qwen3-235b-a22b-gptq-int4-tp2-eagle3"])] == [
        "Qwen/Qwen3-235B-A22B-GPTQ-Int4",
        "nvidia/Qwen3-235B-A22B-Eagle3",
    ]
    assert weight_repos(profiles["qwen3-235b-a22b-gptq-int4-tp2-eagle3"])[1]["revision"] == (
        "33f3c01ce807376d1171301b9a148b1b28f239ba"
    )
    for name, profile in profiles.items():  # every other shipped profile: the model alone
        if name != "qwen3-235b-a22b-gptq-int4-tp2-eagle3":
            assert [r["what"] for r in weight_repos(profile)] == ["model"], name
