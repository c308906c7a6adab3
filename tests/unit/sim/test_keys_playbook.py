"""playbooks/keys.yml run by ansible-playbook on loopback: the example inventory with every host local, a real
PostgreSQL, the gateway's keys module under the Python that runs pytest (it needs psycopg: the gateway venv,
docs/gateway.md "Reproduce"). What it proves: a key's class and limits come from the deployment's last capacity
sweep record (the one benchmark.yml writes on the control node) or from the overrides, are stored with the key,
a rerun keeps the class and changes nothing, another deployment's sweep changes the limits in place, a bad value
stops the play naming the key and changes nothing, and the listing shows class, limits and refusals.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT
from double_fixtures import free_port

psycopg = pytest.importorskip("psycopg")
pytest.importorskip("ansible")
PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)), None)
PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(PG_BIN is None, reason="PostgreSQL's server (Debian postgresql) is not installed"),
    pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason="no ansible-playbook beside this Python"),
]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
import gateway_keys  # noqa: E402 - the same file the gateway imports


def _as_pg(argv):
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="module")
def pg():
    folder = Path(tempfile.mkdtemp(prefix="sparkops-keys-pg-"))
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    data, port, bindir = folder / "data", free_port(), PG_BIN.parent
    subprocess.run(
        _as_pg([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "gw"]), check=True, capture_output=True
    )
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {folder}"
    start = [str(bindir / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(folder / "log"), "-w", "start"]
    subprocess.run(_as_pg(start), check=True, capture_output=True, timeout=60)
    yield f"host=127.0.0.1 port={port} user=gw dbname=postgres"
    subprocess.run(
        _as_pg([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"]), check=False, capture_output=True
    )
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory, pg):
    """The example inventory (deployments chat and code), its control-node folders, and how to run keys.yml."""
    top = tmp_path_factory.mktemp("keys")
    inv = top / "inv"
    shutil.copytree(ROOT / "inventory" / "examples" / "gateway-keys", inv)
    sweeps = top / "reports" / "benchmarks"
    sweeps.mkdir(parents=True)
    extra = {
        "ansible_connection": "local",
        "ansible_become": False,
        "ansible_python_interpreter": sys.executable,
        "sparkops_gateway_venv": str(Path(sys.executable).parent.parent),
        "sparkops_gateway_conninfo": pg,
        "sparkops_credentials_dir": str(top / "creds"),
        "sparkops_reports_dir": str(top / "reports"),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CALLBACKS_ENABLED="sparkops.cluster.module_cache",  # profile_tasks is ansible.posix's
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
    )

    def run(*more: str):
        argv = [str(PLAYBOOK_BIN), str(ROOT / "playbooks" / "keys.yml"), "-i", str(inv), "-e", json.dumps(extra)]
        return subprocess.run(
            [*argv, *more], env=env, capture_output=True, text=True, timeout=240, cwd=ROOT, check=False
        )

    return run, sweeps, top


def _flat(done) -> str:
    """The play's output on one line (the callback wraps long messages)."""
    return " ".join(done.stdout.split())


def _stored(pg, name):
    with psycopg.connect(pg) as conn:
        return gateway_keys.key_limits(conn, name)


def test_keys_yml_stores_the_class_and_limits_from_the_sweep_and_the_overrides(site, pg):
    run, sweeps, top = site
    # No sweep yet: an interactive key without a limit, a batch key at one request, and the play says why.
    first = run("-e", "sparkops_key_name=alice")
    assert first.returncode == 0, first.stdout[-3000:]
    assert "no parallel limit (no capacity sweep recorded: run playbooks/benchmark.yml" in _flat(first)
    assert _stored(pg, "alice") == {"key_class": "interactive", "max_parallel_requests": None, "tpm_limit": None}
    early = run("-e", "sparkops_key_name=early", "-e", "sparkops_key_class=batch")
    assert early.returncode == 0, early.stdout[-3000:]
    assert _stored(pg, "early") == {"key_class": "batch", "max_parallel_requests": 1, "tpm_limit": None}
    secret = (top / "creds" / "keys" / "alice").read_text().strip()
    assert secret.startswith("sk-sparkops-") and secret not in first.stdout + first.stderr
    # benchmark.yml's records on the control node: the first deployment (chat) holds 4 users, code 9.
    for dep, users in (("chat", 4), ("code", 9)):
        doc = {"source": "hardware", "capacity": {"users_at_slo": users}}
        (sweeps / f"gateway-keys-{dep}-20261120T100000Z.json").write_text(json.dumps(doc))
    batch = run("-e", "sparkops_key_name=nightly", "-e", "sparkops_key_class=batch")
    assert batch.returncode == 0, batch.stdout[-3000:]
    assert _stored(pg, "nightly") == {"key_class": "batch", "max_parallel_requests": 3, "tpm_limit": None}
    again = run("-e", "sparkops_key_name=nightly")  # no class given: the stored one stays
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
    assert _stored(pg, "nightly")["key_class"] == "batch"
    other = run("-e", "sparkops_key_name=nightly", "-e", "sparkops_deployment=code")
    assert other.returncode == 0 and "set the limits of nightly" in _flat(other), other.stdout[-3000:]
    assert _stored(pg, "nightly")["max_parallel_requests"] == 8
    assert (top / "creds" / "keys" / "nightly").exists()
    override = run(
        "-e",
        "sparkops_key_name=alice",
        "-e",
        "sparkops_key_max_parallel_requests=2",
        "-e",
        "sparkops_key_tpm_limit=20000",
    )
    assert override.returncode == 0, override.stdout[-3000:]
    assert _stored(pg, "alice") == {"key_class": "interactive", "max_parallel_requests": 2, "tpm_limit": 20000}
    assert (top / "creds" / "keys" / "alice").read_text().strip() == secret  # the same key


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["-e", "sparkops_key_max_parallel_requests=0"],
            "key nightly: max_parallel_requests must be a whole number >= 1",
        ),
        (["-e", "sparkops_key_tpm_limit=lots"], "key nightly: tpm_limit must be a whole number >= 1"),
        (["-e", "sparkops_key_class=gold"], "key nightly: class 'gold' is not one of interactive, batch"),
    ],
)
def test_a_bad_class_or_limit_stops_keys_yml_naming_the_key_and_changes_nothing(site, pg, args, said):
    run, _sweeps, _top = site
    before = _stored(pg, "nightly")
    bad = run("-e", "sparkops_key_name=nightly", *args)
    assert bad.returncode != 0 and said in _flat(bad) and "Nothing was changed" in _flat(bad), bad.stdout[-3000:]
    assert _stored(pg, "nightly") == before


def test_the_listing_shows_each_key_s_class_limits_and_refusals(site):
    run, _sweeps, _top = site
    listing = run()
    assert listing.returncode == 0, listing.stdout[-3000:]
    assert "alice: active, interactive, 2 parallel, 20000 tokens/min, 0 requests" in _flat(listing)
    line = "nightly: active, batch, 8 parallel, 0 requests, 0 prompt and 0 completion tokens, 0 refused (429)"
    assert line in _flat(listing)


def test_a_table_made_before_the_limits_gets_their_columns_and_keeps_its_keys(pg):
    """An upgrade: the table as the gateway made it before classes and limits (gateway_keys.SCHEMA alone), a key
    in it; ensure_schema (the module's, and the hook's on each new connection) adds the columns, the key stays
    valid as an interactive key without limits, and a second run changes nothing."""
    with psycopg.connect(pg, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS old_keys")
        admin.execute("CREATE DATABASE old_keys")
    old = pg.replace("dbname=postgres", "dbname=old_keys")
    with psycopg.connect(old) as conn:
        with conn.cursor() as cur:
            cur.execute(gateway_keys.SCHEMA)
        conn.commit()
        key = gateway_keys.create(conn, "veteran")
        gateway_keys.ensure_schema(conn)
        gateway_keys.ensure_schema(conn)
        assert gateway_keys.lookup_entry(conn, key) == {
            "name": "veteran",
            "key_class": "interactive",
            "max_parallel_requests": None,
            "tpm_limit": None,
        }
        assert gateway_keys.usage(conn)[0]["refused"] == 0
