"""Stacks as data (roles/sparkops_defaults/defaults/main/stacks.yml, plugins/plugin_utils/stacks.py): the shipped
stacks, the one source of the pins, the profiles each stack serves, and the refusals that name the flag and the
release."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.plugin_utils import vllm_contract
from ansible_collections.sparkops.cluster.plugins.plugin_utils.cluster import ClusterError, build_cluster
from ansible_collections.sparkops.cluster.plugins.plugin_utils.serving import build_serving
from ansible_collections.sparkops.cluster.plugins.plugin_utils.stacks import (
    check_stack,
    profile_problems_on,
    stack_contract,
    stack_lines,
    stack_plan,
)
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (
    check_serve_args,
    load_contract,
    option_history,
)
from cluster_inventories import pair
from conftest import ROOT

DEFAULTS = ROOT / "roles" / "sparkops_defaults" / "defaults" / "main"
STACKS_YML = yaml.safe_load((DEFAULTS / "stacks.yml").read_text())
STACKS = STACKS_YML["sparkops_stacks"]
PROFILES = yaml.safe_load((DEFAULTS / "serving_profiles.yml").read_text())["sparkops_serving_profiles"]
NEW = ("glm-5.3-flash-nvfp4-tp2-mtp", "deepseek-v4-flash-tp2", "qwen3.8-27b-nvfp4-mtp")


def plan(stack: str, **extra) -> dict:
    inputs = {"stack_name": stack, "stacks": STACKS, "vllm_version": STACKS[stack]["vllm_version"], **extra}
    return stack_plan(inputs, PROFILES, 1)


# --- the shipped stacks ---------------------------------------------------------------------------------


def test_the_default_stack_is_0_19_0_with_the_reference_pins():
    assert STACKS_YML["sparkops_stack"] == "vllm-0.19.0"
    ref = STACKS["vllm-0.19.0"]
    assert (ref["vllm_version"], ref["vllm_commit"], ref["contract"], ref["ray"]) == (
        "0.19.0",
        "2a69949bd",
        "0.19.0",
        "2.52.1",
    )
    assert ref["image"] == {
        "source": "eugr",
        "repo": "https://github.com/eugr/spark-vllm-docker.git",
        "ref": "fc08740fba1e79530a879c411b7e39fb65da2a18",
        "name": "vllm-node",
        "build_args": ["--vllm-ref", "v0.19.0", "--flashinfer-ref", "v0.6.6"],
    }
    assert ref["pins"] == {
        "flashinfer": "0.6.6",
        "cuda": "13.2",
        "torch": None,
        "nccl": None,
        "flashinfer_cutlass": None,  # FlashInfer 0.6.6's own CUTLASS, which the image check knows
    }


def test_the_current_stack_is_0_33_0_from_vllm_s_aarch64_image():
    cur = STACKS["vllm-0.33.0"]
    assert (cur["vllm_version"], cur["vllm_commit"], cur["contract"]) == ("0.33.0", "4ba787ec9", "0.33.0")
    # the wheel's METADATA: torch==2.14.0, flashinfer-python==0.7.2.post1; the wheel's _version.py: g4ba787ec9
    assert cur["pins"]["torch"] == "2.14.0" and cur["pins"]["flashinfer"] == "0.7.2.post1"
    assert cur["image"]["source"] == "registry"
    assert cur["image"]["registry_image"] == "vllm/vllm-openai:v0.33.0-aarch64"
    assert cur["image"]["registry_digest"] == ""  # read at the first pull, held by the lock afterwards
    assert load_contract("0.33.0")["source"]["wheel"].startswith("vllm-0.33.0-")


@pytest.mark.parametrize("name", sorted(STACKS))
def test_every_shipped_stack_is_well_formed_and_has_its_contract(name):
    assert check_stack(name, STACKS[name]) == []
    assert stack_contract(STACKS[name])["vllm_version"] == STACKS[name]["vllm_version"]


def test_the_pins_live_in_the_stack_only():
    """One source of truth: versions.yml derives every pin from the selected stack and repeats none."""
    text = (DEFAULTS / "versions.yml").read_text()
    for literal in ("fc08740fba1e79530a879c411b7e39fb65da2a18", '2a69949bd"', '0.6.6"', "--vllm-ref", "2.52.1"):
        assert literal not in text, literal
    versions = yaml.safe_load(text)
    assert versions["sparkops_stack_spec"] == "{{ sparkops_stacks[sparkops_stack] }}"
    for var in (
        "spark_vllm_image_source",
        "spark_vllm_image_ref",
        "spark_vllm_image_build_args",
        "sparkops_vllm_version",
        "sparkops_vllm_commit",
        "sparkops_ray_version",
        "sparkops_image_pins",
    ):
        assert "sparkops_stack_spec" in str(versions[var]), var


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda s: s.update(vllm_version="0.33"), "vllm_version must be a release like '0.19.0'"),
        (lambda s: s.update(vllm_commit="G4BA787EC9"), "vllm_commit must be 7-40 lower-case hex"),
        (lambda s: s.update(colour="red"), "unknown key(s) colour"),
        (lambda s: s["pins"].pop("cuda"), "pins must map exactly flashinfer, cuda, torch, nccl"),
        (lambda s: s["image"].update(registry_image="vllm/vllm-openai@sha256:" + "0" * 64), "must be an image by tag"),
        (lambda s: s["image"].update(registry_digest="sha256:xyz"), "registry_digest must be sha256:<64 hex>"),
        (lambda s: s["image"].update(source="nix"), "source is eugr (a build) or registry"),
    ],
)
def test_a_malformed_stack_is_refused_naming_the_key(mutate, needle):
    spec = copy.deepcopy(STACKS["vllm-0.33.0"])
    mutate(spec)
    found = check_stack("vllm-0.33.0", spec)
    assert any(needle in f for f in found), found
    assert all(f.startswith("sparkops_stacks['vllm-0.33.0']") for f in found), found


# --- the profiles each stack serves ---------------------------------------------------------------------


def test_the_reference_stack_serves_the_reference_and_not_todays_models():
    out = plan("vllm-0.19.0")
    assert out["problems"] == []
    stack = out["stack"]
    assert "qwen3-235b-a22b-gptq-int4-tp2" in stack["serves"] and "gpt-oss-120b-mxfp4" in stack["serves"]
    for name in NEW:
        entry = stack["not_served"][name]
        assert entry["served_by"] == ["vllm-0.33.0"], name
        text = " ".join(entry["reasons"])
        # the flag, the release that lacks it and the release that has it
        assert "--linear-backend: unrecognized argument for vLLM 0.19.0" in text, text
        assert "it is new in vLLM 0.33.0" in text, text
        assert "needs vLLM 0.33.0 or newer" in text, text


def test_the_current_stack_serves_todays_models_and_names_what_it_dropped():
    out = plan("vllm-0.33.0")
    assert out["problems"] == []
    stack = out["stack"]
    for name in NEW + ("qwen3-235b-a22b-gptq-int4-tp2",):
        assert name in stack["serves"], (name, stack["not_served"].get(name))
    gptoss = stack["not_served"]["gpt-oss-120b-mxfp4"]
    assert gptoss["served_by"] == ["vllm-0.19.0"]
    assert any(
        r.startswith("VLLM_MXFP4_USE_MARLIN: vLLM 0.33.0 does not read")
        and "vLLM 0.19.0 read it; 0.33.0 dropped it" in r
        for r in gptoss["reasons"]
    ), gptoss


def test_the_plan_refuses_a_profile_only_the_other_stack_serves_naming_flag_release_and_stack():
    cluster = build_cluster(pair())
    inputs = {
        "profile_name": "glm-5.3-flash-nvfp4-tp2-mtp",
        "profiles": PROFILES,
        "stack_name": "vllm-0.19.0",
        "stacks": STACKS,
        "vllm_version": "0.19.0",
        "allow_rules": [{"rule": "not-recommended", "reason": "test"}],
        "image": {"source": "eugr", "name": "vllm-node", "repo": "r", "ref": "a" * 40, "build_args": []},
    }
    with pytest.raises(ClusterError) as err:
        build_serving(cluster, inputs)
    text = str(err.value)
    assert "--linear-backend: unrecognized argument for vLLM 0.19.0" in text
    assert "it is new in vLLM 0.33.0" in text
    assert "Stack vllm-0.33.0 serves it: set sparkops_stack: vllm-0.33.0" in text
    # on its own stack (with the escape hatch used) the same profile is planned, and the plan names the stack
    served = build_serving(
        cluster,
        dict(
            inputs,
            stack_name="vllm-0.33.0",
            vllm_version="0.33.0",
            image={"source": "registry", "name": "vllm-node", "registry_ref": ""},
        ),
    )
    assert served["stack"]["name"] == "vllm-0.33.0"
    assert "glm-5.3-flash-nvfp4-tp2-mtp" in served["stack"]["serves"]


def test_an_unknown_stack_or_a_disagreeing_version_stops_the_plan():
    out = stack_plan({"stack_name": "vllm-9.9.9", "stacks": STACKS}, PROFILES, 1)
    assert out["stack"] is None
    assert "sparkops_stack 'vllm-9.9.9' is not a known stack. Known: vllm-0.19.0, vllm-0.33.0" in out["problems"][0]
    out = plan("vllm-0.33.0", vllm_version="0.19.0")
    assert any(
        "sparkops_vllm_version is 0.19.0 but sparkops_stack 'vllm-0.33.0' is vLLM 0.33.0" in p for p in out["problems"]
    )


def test_a_profile_no_stack_accepts_is_a_problem_on_every_stack():
    broken = dict(PROFILES["qwen3-30b-a3b"], extra_args=["--max-modle-len", "4"])
    profiles = {**PROFILES, "typo": broken}
    for name in STACKS:
        out = stack_plan(
            {"stack_name": name, "stacks": STACKS, "vllm_version": STACKS[name]["vllm_version"]}, profiles, 1
        )
        assert any(
            p.startswith("Serving profile 'typo' is refused by every stack's vLLM") and "--max-modle-len" in p
            for p in out["problems"]
        ), out["problems"]


def test_without_stacks_the_pinned_release_is_the_stack_and_the_recorded_ones_the_others():
    profiles = {"ref": PROFILES["qwen3-30b-a3b"], "glm": PROFILES["glm-5.3-flash-nvfp4-tp2-mtp"]}
    out = stack_plan({"vllm_version": "0.19.0"}, profiles, 1)
    assert out["problems"] == [] and out["stack"]["name"] == "vllm-0.19.0" and out["stack"]["serves"] == ["ref"]
    assert out["stack"]["not_served"]["glm"]["served_by"] == ["vllm-0.33.0"]


def test_stack_lines_say_what_the_stack_is_and_serves():
    lines = stack_lines(plan("vllm-0.33.0")["stack"])
    assert lines[0] == (
        "stack vllm-0.33.0: vLLM 0.33.0 (commit 4ba787ec9), image pulled vllm/vllm-openai:v0.33.0-aarch64 "
        "(digest: read at the first pull, then held by the lock)"
    )
    assert any(
        line.startswith("  not gpt-oss-120b-mxfp4 (served by vllm-0.19.0): VLLM_MXFP4_USE_MARLIN") for line in lines
    )
    assert lines[-1] == "  other stacks: vllm-0.19.0 (plan with -e sparkops_stack=<name>)"


# --- flags across releases ------------------------------------------------------------------------------


def test_the_0_33_0_contract_accepts_the_hidden_no_forms_it_still_registers():
    """vllm/utils/argparse_utils.py:120-152 of 0.33.0: --no-enable-x / --no-disable-x stay registered."""
    v033 = load_contract("0.33.0")
    for flag in (
        "--no-enable-prefix-caching",
        "--no-enable-chunked-prefill",
        "--no-disable-custom-all-reduce",
        "--enable-prefix-caching",
        "--disable-prefix-caching",
    ):
        assert check_serve_args(["m", flag], {}, v033) == [], flag
    assert v033["serve_options"]["--no-enable-prefix-caching"]["hidden"] is True
    assert v033["serve_options"]["--disable-prefix-caching"]["hidden"] is False
    # sparkops writes --no-enable-prefix-caching for a profile with prefix caching off
    off = dict(PROFILES["qwen3-30b-a3b"], enable_prefix_caching=False)
    assert profile_problems_on(off, v033) == []


def test_a_flag_removed_in_the_newer_release_is_refused_naming_both_releases():
    v033 = load_contract("0.33.0")
    found = check_serve_args(["m", "--max-num-partial-prefills", "2"], {}, v033)
    assert found == [
        "--max-num-partial-prefills: unrecognized argument for vLLM 0.33.0 `vllm serve` (it would exit 2); "
        "vLLM 0.19.0 took it; 0.33.0 removed it"
    ]


def test_a_renamed_flag_is_refused_with_its_new_name(monkeypatch):
    """Renamed: the older release's option and the newer one's share the argparse dest (the same setting)."""
    old = copy.deepcopy(load_contract("0.19.0"))
    new = copy.deepcopy(load_contract("0.33.0"))
    old["vllm_version"], new["vllm_version"] = "0.90.0", "0.91.0"
    spec = new["serve_options"].pop("--max-model-len")
    new["serve_options"]["--max-context-len"] = dict(spec, aliases=[])
    monkeypatch.setattr(vllm_contract, "recorded_versions", lambda: ["0.90.0", "0.91.0"])
    releases = {"0.90.0": old, "0.91.0": new}
    monkeypatch.setattr(vllm_contract, "load_contract", lambda version: releases[str(version)])
    assert option_history("--max-model-len", new) == "vLLM 0.90.0 took it; 0.91.0 renamed it to --max-context-len"
    found = check_serve_args(["m", "--max-model-len", "4096"], {}, new)
    assert found == [
        "--max-model-len: unrecognized argument for vLLM 0.91.0 `vllm serve` (it would exit 2); "
        "vLLM 0.90.0 took it; 0.91.0 renamed it to --max-context-len"
    ]


# --- playbooks/plan.yml on inventory/two-sparks, each stack (contacts no host) -------------------------


def _plan_two_sparks(tmp_path, *extra: str) -> tuple[int, str, dict | None]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}:{Path(sys.executable).parent}:{env.get('PATH', '')}"
    out_file = tmp_path / "plan.json"
    res = subprocess.run(
        [
            "ansible-playbook",
            "-i",
            str(ROOT / "inventory" / "two-sparks"),
            str(ROOT / "playbooks" / "plan.yml"),
            "-e",
            f"sparkops_plan_file={out_file}",
            "-e",
            f"sparkops_lock_file={tmp_path / 'no-lock.json'}",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
        check=False,
    )
    text = " ".join((res.stdout + res.stderr).split())  # Ansible folds long lines
    return res.returncode, text, json.loads(out_file.read_text()) if out_file.is_file() else None


@pytest.mark.parametrize(
    ("stack", "serves", "not_served"),
    [
        ("vllm-0.19.0", "gpt-oss-120b-mxfp4", "glm-5.3-flash-nvfp4-tp2-mtp (served by vllm-0.33.0)"),
        ("vllm-0.33.0", "glm-5.3-flash-nvfp4-tp2-mtp", "gpt-oss-120b-mxfp4 (served by vllm-0.19.0)"),
    ],
)
def test_plan_yml_on_two_sparks_lists_what_each_stack_serves(tmp_path, stack, serves, not_served):
    rc, text, written = _plan_two_sparks(tmp_path, "-e", f"sparkops_stack={stack}")
    assert rc == 0, text[-3000:]
    assert "unreachable=0" in text
    assert f"stack {stack}: vLLM {STACKS[stack]['vllm_version']}" in text
    assert f"not {not_served}:" in text
    plan_stack = written["serving"]["stack"]
    assert plan_stack["name"] == stack and serves in plan_stack["serves"]
    assert "qwen3-235b-a22b-gptq-int4-tp2" in plan_stack["serves"]  # the inventory's profile, on both


def test_plan_yml_refuses_a_profile_of_the_other_stack_naming_flag_and_release(tmp_path):
    rc, text, _written = _plan_two_sparks(
        tmp_path, "-e", "sparkops_serving_profile=glm-5.3-flash-nvfp4-tp2-mtp", "-e", "sparkops_stack=vllm-0.19.0"
    )
    assert rc != 0
    assert "--linear-backend: unrecognized argument for vLLM 0.19.0" in text
    assert "it is new in vLLM 0.33.0" in text
    assert "Stack vllm-0.33.0 serves it: set sparkops_stack: vllm-0.33.0" in text


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_every_vllm_metric_the_alerts_and_dashboard_query_is_exported_by_every_stack(stack):
    """A stack whose vLLM dropped a metric family the monitoring reads would show empty panels and silent alerts."""
    import test_monitoring_queries as mq  # noqa: PLC0415 - tests/unit is on the path (conftest)

    families = load_contract(STACKS[stack]["contract"])["metrics"]
    series = set()
    for fam in families:
        suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}.get(
            fam.get("type"), ("",)
        )
        series |= {fam["name"] + s for s in suffixes}
    queried = {
        name for exprs in (mq.rule_exprs, mq.dashboard_exprs) for _t, e in exprs() for name in mq.metric_names(e)
    }
    missing = sorted(n for n in queried if n.startswith("vllm:") and n not in series)
    assert missing == [], f"{stack} (vLLM {STACKS[stack]['vllm_version']}) does not export {missing}"
