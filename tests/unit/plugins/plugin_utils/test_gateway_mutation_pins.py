"""The gateway's LiteLLM config as LiteLLM reads it (plugins/plugin_utils/gateway.py): the router's exact
settings (how soon a failing replica is cooled and for how long, how often a request is retried, how long
one may take), the settings that keep /metrics behind the key and the admin UI off. The keys' usage rows
it refuses; the offline wheelhouse: the Python versions it refuses, the node's markers (never the
controller's), the download rounds' bound, and the script playbooks/gateway_wheels.yml runs."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import zipfile

import packaging.markers
import pytest
from ansible_collections.sparkops.cluster.plugins.filter import gateway as gateway_filters
from ansible_collections.sparkops.cluster.plugins.plugin_utils import gateway
from conftest import ROOT
from test_serving_plan import plan_of_only


def test_the_router_cools_a_replica_on_its_first_failure_for_30_s_and_retries_twice():
    router = gateway.litellm_config(plan_of_only())["router_settings"]
    assert router == {
        "routing_strategy": "simple-shuffle",
        "allowed_fails": 0,
        "cooldown_time": 30,
        "num_retries": 2,
        "retry_after": 0,
        "timeout": 600,
    }


def test_metrics_stay_behind_the_key_and_spend_logs_stay_off():
    """The admin UI's switch and the telemetry veto are in the service's environment, where LiteLLM 1.108.7 reads
    them (test_gateway_config.py): the config carries neither key."""
    cfg = gateway.litellm_config(plan_of_only())
    assert cfg["litellm_settings"] == {
        "callbacks": ["prometheus", "sparkops_gateway_auth.usage_callback"],
        "require_auth_for_metrics_endpoint": True,
        "drop_params": False,
    }
    assert cfg["general_settings"] == {
        "custom_auth": "sparkops_gateway_auth.user_api_key_auth",
        "disable_spend_logs": True,
    }


def test_the_oldest_glibc_the_wheels_take_is_2_17():
    assert gateway.wheel_platforms("aarch64", "glibc 2.17") == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert gateway.wheel_platforms("x86_64", "2.18") == [
        "manylinux_2_18_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
    ]


# The fields usage_lines says it reads: a row without one is refused, never printed with a default (a row without
# its class would otherwise read "interactive", one without its limit "no parallel limit").
USAGE_ROW = {
    "name": "alice",
    "state": "active",
    "requests": 1,
    "prompt_tokens": 2,
    "completion_tokens": 3,
    "refused": 4,
    "key_class": "batch",
    "max_parallel_requests": 1,
    "tpm_limit": None,
}


@pytest.mark.parametrize("field", sorted(USAGE_ROW))
def test_a_usage_row_without_any_of_its_fields_is_refused_naming_it(field):
    row = {k: v for k, v in USAGE_ROW.items() if k != field}
    with pytest.raises(ValueError, match=f"^a key's usage row lacks {field}$"):
        gateway.usage_lines([row])


@pytest.mark.parametrize("python", ["3", "3.", "3.x", "", ".12", "x.12.1"])
def test_a_python_version_without_major_and_minor_is_refused_as_such(python):
    with pytest.raises(gateway.WheelhouseError) as err:
        gateway.wheelhouse_name("x86_64", python)
    assert str(err.value) == f"Python version {python!r}: expected major.minor[.micro]"


def _wheel(folder, name, requires, version="1.0"):
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        meta = "".join(f"Requires-Dist: {r}\n" for r in requires)
        z.writestr(
            f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{meta}"
        )


def test_async_timeout_is_needed_below_python_3_11_3_exactly(tmp_path):
    """redis's `async-timeout; python_full_version < "3.11.3"` (LiteLLM 1.108.7's tree): judged on the node's
    exact Python, micro version included."""
    _wheel(tmp_path, "redis", ['async-timeout>=4.0.3; python_full_version < "3.11.3"'])
    need = {v: gateway.missing_requirements(str(tmp_path), ["redis"], gateway.marker_environment("x86_64", v))
            for v in ("3.11.2", "3.11.3", "3.11")}  # fmt: skip
    assert need == {"3.11.2": ["async-timeout>=4.0.3"], "3.11.3": [], "3.11": ["async-timeout>=4.0.3"]}


# A controller as unlike a node as it gets: what the node needs must not change with it.
CONTROLLER = {
    "implementation_name": "pypy",
    "implementation_version": "7.3.17",
    "os_name": "nt",
    "platform_machine": "AMD64",
    "platform_python_implementation": "PyPy",
    "platform_release": "10",
    "platform_system": "Windows",
    "platform_version": "10.0.19045",
    "python_full_version": "3.9.18",
    "python_version": "3.9",
    "sys_platform": "win32",
}
NODE = {  # Debian 12's CPython 3.11.2 on a Spark (aarch64)
    "implementation_name": "cpython",
    "implementation_version": "3.11.2",
    "os_name": "posix",
    "platform_machine": "aarch64",
    "platform_python_implementation": "CPython",
    "platform_system": "Linux",
    "python_full_version": "3.11.2",
    "python_version": "3.11",
    "sys_platform": "linux",
}


def test_each_marker_is_judged_with_the_node_s_value_never_the_controller_s(tmp_path, monkeypatch):
    """packaging fills a marker the environment lacks from the Python running it (Marker.evaluate starts from
    default_environment()): every PEP 508 marker must come from the node, or the controller's leaks in."""
    monkeypatch.setattr(packaging.markers, "default_environment", lambda: dict(CONTROLLER))
    requires = [f'controller-{k.replace("_", "-")}; {k} == "{v}"' for k, v in CONTROLLER.items()]
    requires += [f'node-{k.replace("_", "-")}; {k} == "{v}"' for k, v in NODE.items()]
    _wheel(tmp_path, "app", requires)
    missing = gateway.missing_requirements(str(tmp_path), ["app"], gateway.marker_environment("aarch64", "3.11.2"))
    assert missing == sorted(f"node-{k.replace('_', '-')}" for k in NODE)


def test_a_dependency_given_by_url_is_judged_by_its_own_marker(tmp_path):
    """A wheel from a private index may name a dependency by URL (PEP 508 `name @ url ; marker`): the colons
    of its URL do not cut the line, so its marker still applies."""
    index = "https://wheels.example.org:8443"
    _wheel(tmp_path, "app", [f'winhelper @ {index}/winhelper-1.0-py3-none-any.whl ; sys_platform == "win32"',
                             f"helper @ {index}/helper-1.0-py3-none-any.whl"])  # fmt: skip
    node = gateway.marker_environment("x86_64", "3.12.3")
    assert gateway.missing_requirements(str(tmp_path), ["app"], node) == ["helper"]


def test_two_extras_bring_what_each_of_them_needs(tmp_path):
    _wheel(tmp_path, "litellm", ["httpx", 'redis; extra == "proxy"', 'boto3; extra == "bedrock"', 'x; extra == "y"'])
    _wheel(tmp_path, "httpx", [])
    node = gateway.marker_environment("x86_64", "3.12.3")
    assert gateway.missing_requirements(str(tmp_path), ["litellm[bedrock,proxy]"], node) == ["boto3", "redis"]


def _chain(length):
    """A fake `pip download` (run=): each round "downloads" what it is asked for; package p<i> needs p<i+1>, but
    only under a marker the node's Python meets, so each round's walk finds one more to download."""
    asked = []

    def run(argv):
        asked.append(argv)
        dest = pathlib.Path(argv[argv.index("--dest") + 1])
        dest.mkdir(exist_ok=True)  # as pip download makes its --dest
        for req in argv[argv.index("--dest") + 2 :]:
            n = int(req[1:])
            nxt = [f'p{n + 1}; python_full_version < "3.11.3"'] if n + 1 < length else []
            _wheel(dest, f"p{n}", nxt)

    return run, asked


def test_the_wheelhouse_download_takes_at_most_six_rounds(tmp_path):
    """Six rounds (the first download and five more for what the node's markers add) are enough for a chain of
    six; a seventh is refused, naming what is still missing. The given run() is the only downloader: pip itself
    (here a path that does not exist) is never started."""
    run, asked = _chain(6)
    kw = {"arch": "x86_64", "python": "3.11.2", "glibc": "2.36"}
    done = gateway.download_wheelhouse(["/nonexistent/pip"], str(tmp_path / "six"), ["p0"], run=run, **kw)
    assert len(done) == 6 and done == asked and [a[-1] for a in done] == [f"p{i}" for i in range(6)]
    run7, asked7 = _chain(7)
    with pytest.raises(gateway.WheelhouseError) as err:
        gateway.download_wheelhouse(["/nonexistent/pip"], str(tmp_path / "seven"), ["p0"], run=run7, **kw)
    assert len(asked7) == 6
    assert str(err.value) == f"the wheelhouse {tmp_path / 'seven'} still lacks p6 for CPython 3.11.2 on x86_64"


FAKE_PIP = r"""
import json, sys, zipfile
from pathlib import Path
argv = sys.argv[1:]
dest = Path(argv[argv.index("--dest") + 1])
with open(dest / "pip-argv.jsonl", "a") as log:
    log.write(json.dumps(argv) + "\n")
for req in argv[argv.index("--dest") + 2 :]:
    name = req.split("==")[0]
    with zipfile.ZipFile(dest / f"{name}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
"""


def test_the_playbook_s_download_command_fills_the_wheelhouse(tmp_path):
    """playbooks/gateway_wheels.yml runs the filter's argv (python gateway.py DEST ARCH PYTHON GLIBC PIP... --
    REQUIREMENTS...); its pip replaced by a stand-in that writes the wheels it is asked for."""
    (tmp_path / "wheels").mkdir()
    (tmp_path / "fake_pip.py").write_text(FAKE_PIP)
    download = gateway_filters.FilterModule().filters()["gateway_wheelhouse_download"]
    argv = download(sys.executable, str(tmp_path / "wheels"), ["litellm==1.108.7"], arch="aarch64",
                    python="3.11.2", glibc="glibc 2.36")  # fmt: skip
    assert argv[6:10] == [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    argv[7:10] = [str(tmp_path / "fake_pip.py")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)  # noqa: S603
    assert res.returncode == 0, res.stderr
    [pip_argv] = [json.loads(line) for line in (tmp_path / "wheels" / "pip-argv.jsonl").read_text().splitlines()]
    assert pip_argv == gateway.pip_download_argv(
        [], str(tmp_path / "wheels"), ["litellm==1.108.7"], arch="aarch64", python="3.11.2", glibc="2.36"
    )
    assert (tmp_path / "wheels" / "litellm-1.0-py3-none-any.whl").is_file()
