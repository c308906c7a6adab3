"""Where the gateway's venv comes from, as the role renders it: the wheelhouse when it holds the pinned LiteLLM
for the head (no index, no network), else the index the head reaches, its URL in pip's environment only (a
mirror's credentials never on a command line), else a refusal (roles/gateway/tasks/read.yml)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests/unit/plugins/plugin_utils"))
from ansible_collections.sparkops.cluster.plugins.filter.gateway import gateway_install_source  # noqa: E402
from cluster_inventories import pair  # noqa: E402
from role_templates import find_task, render_role  # noqa: E402
from test_serving_plan import plan_of  # noqa: E402

FACTS = {"architecture": "aarch64", "python": {"version": {"major": 3, "minor": 12}}}


def _task(file: str, name: str) -> dict:
    return find_task(ROOT / "roles/gateway/tasks" / file, name)


def _render(expr, **more):
    cluster, plan = plan_of(pair())
    host = next(iter(cluster["nodes"]))
    return render_role("gateway", expr, cluster, plan, host, ansible_facts=FACTS, **more)


INSTALL = "Install LiteLLM's proxy and prometheus_client, from the copied wheels or the index"


def _install(source: str, index: str):
    task = _task("install.yml", INSTALL)
    more = {"gateway_install_source": source, "sparkops_gateway_index_url": index}
    return _render(task["ansible.builtin.command"]["argv"], **more), _render(task["environment"], **more)


def test_from_the_wheelhouse_pip_uses_the_copied_wheels_only_and_no_index():
    argv, env = _install("wheelhouse", "https://pypi.org/simple/")
    assert argv[:2] == ["/opt/sparkops/gateway/bin/pip", "install"]
    at = argv.index("--find-links")
    assert argv[at - 1] == "--no-index" and argv[at + 1] == _render("{{ gateway_wheels_dir }}")
    assert argv[-2:] == ["litellm[proxy]==1.108.7", "prometheus_client"]
    assert env == {}, "no index in pip's environment for an offline install"


def test_from_the_index_pip_takes_binary_wheels_and_the_url_only_from_its_environment():
    secret = "https://sparkops:s3cr3t-token@mirror.example.internal/pypi/simple"
    argv, env = _install("index", secret)
    assert "--no-index" not in argv and "--find-links" not in argv
    assert argv[argv.index("--only-binary") + 1] == ":all:"
    assert not any("s3cr3t" in a or "mirror.example" in a for a in argv), argv
    assert env == {"PIP_INDEX_URL": secret + "/"}, "https: nothing trusted beyond what pip verifies"


def test_an_http_index_is_the_site_s_choice_and_its_host_is_trusted_for_pip():
    # pip ignores an http index whose host is not trusted ("not a trusted or secure host"), even when named.
    _argv, env = _install("index", "http://192.168.213.1:5090/simple")
    assert env == {"PIP_INDEX_URL": "http://192.168.213.1:5090/simple/", "PIP_TRUSTED_HOST": "192.168.213.1"}


@pytest.mark.parametrize(
    ("given", "url", "shown"),
    [
        ("https://pypi.org/simple/", "https://pypi.org/simple/", "https://pypi.org/simple/"),
        (
            "http://192.168.213.1:5090/simple//",
            "http://192.168.213.1:5090/simple/",
            "http://192.168.213.1:5090/simple/",
        ),
        (
            "https://me:tok%40en@mirror.example/simple",
            "https://me:tok%40en@mirror.example/simple/",
            "https://mirror.example/simple/",
        ),
    ],
)
def test_the_index_url_ends_in_one_slash_and_is_shown_without_credentials(given, url, shown):
    assert _render("{{ gateway_index_url }}", sparkops_gateway_index_url=given) == url
    assert _render("{{ gateway_index_url_shown }}", sparkops_gateway_index_url=given) == shown


def test_the_index_check_hides_its_result_only_when_the_url_carries_credentials():
    task = _task("read.yml", "Ask the index for LiteLLM's page, from the head")
    assert task["ansible.builtin.uri"]["url"] == "{{ gateway_index_url }}litellm/"
    hide = task["no_log"]
    assert _render(hide, sparkops_gateway_index_url="https://me:pw@mirror.example/simple/") is True
    assert _render(hide, sparkops_gateway_index_url="https://pypi.org/simple/") is False


@pytest.mark.parametrize(
    ("wheel", "index", "source"),
    [
        ("litellm-1.108.7-cp310-abi3-manylinux_2_28_aarch64.whl", "https://pypi.org/simple/", "wheelhouse"),
        ("litellm-1.108.7-cp310-abi3-manylinux_2_28_aarch64.whl", "", "wheelhouse"),
        ("litellm-1.108.6-cp310-abi3-manylinux_2_28_aarch64.whl", "https://pypi.org/simple/", "index"),
        ("litellm-1.108.7-cp310-abi3-manylinux_2_28_x86_64.whl", "https://pypi.org/simple/", "index"),
        (None, "https://pypi.org/simple/", "index"),
        (None, "", "none"),
    ],
)
def test_the_wheelhouse_wins_when_it_holds_the_pin_for_the_head_else_the_index_else_nothing(
    tmp_path, wheel, index, source
):
    platform = tmp_path / "gateway" / "linux-aarch64-cp312"
    platform.mkdir(parents=True)
    if wheel:
        (platform / wheel).write_text("")
    assert gateway_install_source(str(platform), "1.108.7", "aarch64", index) == source
    # The role asks the filter with the head's folder, the pin, its architecture and the index.
    expr = yaml.safe_load((ROOT / "roles/gateway/vars/main.yml").read_text())["gateway_install_source"]
    assert "gateway_wheelhouse_platform | sparkops.cluster.gateway_install_source(" in expr
    assert "sparkops_gateway_litellm_version" in expr and "ansible_facts.architecture" in expr
    assert "sparkops_gateway_index_url" in expr
