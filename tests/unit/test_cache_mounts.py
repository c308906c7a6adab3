"""Every cache folder vLLM 0.19.0 writes during a start is on the host (issue 17: the second start must not recompile).

The folders come from tests/fixtures/vllm/cache_paths-0.19.0.json (read from the release's files, each entry cites
them); the mounts and the containers' cache environment from roles/sparkops_defaults/defaults/main/cluster.yml.
A path is resolved as the containers see it: ${VAR:-default} takes VAR from the container's environment
(sparkops_container_cache_env, plus the serving profile's env in the vLLM container), else the default.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = ROOT / "roles/sparkops_defaults/defaults/main"
FIXTURE = json.loads((ROOT / "tests/fixtures/vllm/cache_paths-0.19.0.json").read_text())
CLUSTER = yaml.safe_load((DEFAULTS / "cluster.yml").read_text())
PROFILES = yaml.safe_load((DEFAULTS / "serving_profiles.yml").read_text())["sparkops_serving_profiles"]
MUST_PERSIST = [p for p in FIXTURE["paths"] if p["must_persist"]]
_EXPANSION = re.compile(r"\$\{(\w+):-")


def resolve(template: str, env: dict) -> str:
    """Shell's ${VAR:-default}, nested defaults included; no other syntax."""
    out, i = [], 0
    while (m := _EXPANSION.search(template, i)) is not None:
        out.append(template[i : m.start()])
        depth, j = 1, m.end()
        while depth:  # find the brace that closes this expansion
            if j >= len(template):
                raise ValueError(f"unbalanced ${{ in {template!r}")
            depth += template.startswith("${", j) - (template[j] == "}")
            j += 1 + template.startswith("${", j)
        default = template[m.end() : j - 1]
        out.append(env[m.group(1)] if env.get(m.group(1)) else resolve(default, env))
        i = j
    out.append(template[i:])
    return "".join(out)


def container_mounts(volumes: list[str]) -> list[str]:
    """The container side of each `host:container[:options]` volume."""
    return [v.split(":")[1] for v in volumes]


def unmounted(volumes: list[str], env: dict) -> list[str]:
    """The fixture's must-persist paths (and their `also` twins) under no mount, as `id: path`."""
    mounts = container_mounts(volumes)
    problems = []
    for entry in MUST_PERSIST:
        for template in filter(None, (entry["path"], entry.get("also"))):
            path = resolve(template, env)
            if not any(path == m or path.startswith(m.rstrip("/") + "/") for m in mounts):
                problems.append(f"{entry['id']}: {path}")
    return problems


def container_envs() -> dict[str, dict]:
    """The Ray container (where vLLM's GPU workers run) and the vLLM container under every shipped profile."""
    cache_env = CLUSTER["sparkops_container_cache_env"]
    envs = {"ray": dict(cache_env)}
    for name, profile in PROFILES.items():
        envs[f"vllm/{name}"] = {**cache_env, **(profile.get("env") or {})}
    return envs


def test_resolve_follows_shell_defaults():
    t = "${A:-${B:-/x}/y}/z"
    assert resolve(t, {}) == "/x/y/z"
    assert resolve(t, {"B": "/b"}) == "/b/y/z"
    assert resolve(t, {"A": "/a", "B": "/b"}) == "/a/z"
    assert resolve(t, {"A": ""}) == "/x/y/z"  # :- treats empty as unset
    with pytest.raises(ValueError):
        resolve("${A:-/x", {})


def test_fixture_is_the_pinned_release_with_sources():
    stacks = yaml.safe_load((DEFAULTS / "stacks.yml").read_text())
    pinned = stacks["sparkops_stacks"][stacks["sparkops_stack"]]["vllm_version"]
    assert FIXTURE["vllm_version"] == pinned
    assert "2d0e5fae45367bdbf111fcad68f4c0f8fdddd2f2fb643e52f0f2daebef7b41cf" in FIXTURE["source"]["vllm"]
    ids = [p["id"] for p in FIXTURE["paths"]]
    assert len(ids) == len(set(ids))
    for entry in FIXTURE["paths"]:
        assert entry["written_by"] and all(re.search(r"lines? \d+|observed", w) for w in entry["written_by"]), entry
        assert entry["must_persist"] or entry.get("why_not"), entry["id"]
    # The ones the compile-cache question is about are there.
    assert {"vllm_compile_cache", "vllm_aot_compile", "inductor_default_cache", "triton_cache_after_inductor"} <= set(
        ids
    )


@pytest.mark.parametrize("container", sorted(container_envs()))
def test_every_cache_vllm_writes_is_on_the_host(container):
    env = container_envs()[container]
    problems = unmounted(CLUSTER["sparkops_container_volumes"], env)
    assert not problems, f"{container}: cache folders of vLLM 0.19.0 that die with the container: {problems}"
    # Each resolved path is absolute and fully expanded (a typo in a variable name would leave ${...}).
    for entry in MUST_PERSIST:
        assert resolve(entry["path"], env).startswith("/") and "${" not in resolve(entry["path"], env)


def _cache_volumes():
    return [v for v in CLUSTER["sparkops_container_volumes"] if "sparkops_cache_dir" in v]


@pytest.mark.parametrize("removed", _cache_volumes())
def test_removing_any_cache_mount_is_caught(removed):
    volumes = [v for v in CLUSTER["sparkops_container_volumes"] if v != removed]
    assert unmounted(volumes, container_envs()["ray"]), f"no fixture path needs {removed}: dead mount?"


def test_without_the_cache_env_inductor_and_triton_caches_stay_in_tmp():
    problems = unmounted(CLUSTER["sparkops_container_volumes"], {})
    assert {p.split(":")[0] for p in problems} == {"inductor_default_cache", "triton_cache_after_inductor"}
    assert all(": /tmp/torchinductor_root" in p for p in problems)


BENCHMARK = ROOT / "benchmarks/compile_cache_reuse.py"


# benchmarks/ stays out of the built collection (galaxy.yml build_ignore): under `ansible-test units`
# (the installed tree) there is no benchmark to compare; `make unit` runs this from the checkout.
@pytest.mark.skipif(not BENCHMARK.is_file(), reason="benchmarks/ is not shipped in the built collection")
def test_the_benchmark_lays_out_what_sparkops_mounts():
    spec = importlib.util.spec_from_file_location("compile_cache_reuse", BENCHMARK)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    by_name = {v.split(":")[0].rsplit("/", 1)[-1]: v.split(":")[1] for v in _cache_volumes()}
    assert by_name == bench.SPARKOPS_CACHE_MOUNTS
    assert CLUSTER["sparkops_container_cache_env"] == bench.SPARKOPS_CACHE_ENV


def test_the_model_cache_is_read_only_and_nothing_vllm_writes_lands_on_it():
    """Issue 23: Ray's job API has no authentication; a writable Hugging Face cache in its containers would let
    whoever reaches Ray plant files or links there for the next sync (root) to spread. vLLM only reads it
    (HF_HUB_OFFLINE=1): every folder it writes (the fixture's, and remote code's HF_MODULES_CACHE) is elsewhere."""
    volumes = CLUSTER["sparkops_container_volumes"]
    (hf,) = [v for v in volumes if v.split(":")[1] == "/root/.cache/huggingface"]
    assert hf.split(":")[2:] == ["ro"], hf
    read_only = [v.split(":")[1] for v in volumes if v.split(":")[2:] == ["ro"]]
    for name, env in container_envs().items():
        writes = [resolve(t, env) for e in FIXTURE["paths"] for t in filter(None, (e["path"], e.get("also")))]
        writes.append(env.get("HF_MODULES_CACHE", "/root/.cache/huggingface/modules"))
        on_ro = [w for w in writes if any(w == m or w.startswith(m.rstrip("/") + "/") for m in read_only)]
        assert not on_ro, (name, on_ro)
