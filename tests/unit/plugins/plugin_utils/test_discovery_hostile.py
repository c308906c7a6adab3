"""A hostile LLDP neighbour: whatever a switch, a cable's far end or a compromised Spark announces (system
name, port description, chassis and port ids) reaches hosts.yml only as escaped, printable comment text or a
quoted scalar. The system name below ends a YAML comment with a newline and writes a group `evil` whose
host spark-1 gets an ssh ProxyCommand: `ansible -i hosts.yml spark-1 -m ping` would run it on the control
node. lldpd keeps the TLV's octets as sent (lldpd src/daemon/protocols/lldp.c, lldp_decode: PEEK_BYTES of
the whole TLV) and lldpcli's json writer escapes the newline as \\n (src/client/json_writer.c,
json_string_dump), so json.loads gives the newline back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkops.cluster.plugins.module_utils import fabric_discovery as fd
from ansible_collections.sparkops.cluster.plugins.plugin_utils import discovery as d
from conftest import FIXTURES
from discovery_world import World, names_of

HOSTILE = "sw-200g\nevil:\n  hosts:\n    spark-1:\n      ansible_ssh_common_args: \"-o ProxyCommand='touch /tmp/x'\"\n#"
NAMES = names_of(3)
CONNECTION = {h: {"ansible_host": f"10.0.0.{11 + i}", "ansible_user": "nvidia"} for i, h in enumerate(NAMES)}


def _switch_world(name: str) -> World:
    world = World(NAMES, switch={(h, 1) for h in NAMES})
    world.switch_name = name
    return world


def _rendered(name: str) -> str:
    result = d.infer(_switch_world(name).nodes(), NAMES, {"speed_mbps": 200000})
    return d.render_inventory(result, CONNECTION, source="inventory/hosts-only")


def _groups_and_hosts(data: dict) -> dict:
    """{group: sorted hosts} over the whole tree, and every host's variables by name."""
    groups, hostvars = {}, {}

    def walk(name, group):
        group = group or {}
        groups[name] = sorted((group.get("hosts") or {}).keys())
        for h, hv in (group.get("hosts") or {}).items():
            hostvars.setdefault(h, {}).update(hv or {})
        for child, sub in (group.get("children") or {}).items():
            walk(child, sub)

    for top, group in data.items():
        walk(top, group)
    return {"groups": groups, "hostvars": hostvars}


# ------------------------------------------------------------------------------ the parser
def test_the_parser_escapes_every_string_a_neighbour_sent():
    got = fd.parse_lldp_neighbours((FIXTURES / "discovery" / "lldpd_json0_hostile_neighbor.json").read_text())
    (nb,) = got["enp1s0f1np1"]
    assert nb["sysname"] == (
        "sw-200g\\nevil:\\n  hosts:\\n    spark-1:\\n      ansible_ssh_common_args: \"-o ProxyCommand='touch "
        "/tmp/x'\"\\n#"
    )
    assert nb["port_id"] == "swp1s0\\r"
    assert nb["port_descr"] == "swp1s0\\x1b]0;owned\\x07"  # an xterm title sequence, shown, not run
    assert nb["chassis_id"] == "b8:ce:f6:00:00:01" and nb["bridge"] is True
    for value in nb.values():
        assert not isinstance(value, str) or value.isprintable()


def test_the_parser_escapes_format_characters_and_cuts_at_255():
    assert fd.neighbour_text("sw\u202eg") == "sw\\u202eg"  # a right-to-left override
    assert fd.neighbour_text("a" * 600) == "a" * 255
    assert fd.neighbour_text(None) is None
    assert fd.neighbour_text("sw-200g.lab") == "sw-200g.lab"


def test_a_raw_0x1f_from_lldpd_1_0_18_is_read_and_escaped():
    # lldpd up to 1.0.18 writes 0x1f unescaped (json_writer.c: `c < 0x1f`): invalid JSON for a strict reader,
    # so one such octet in a neighbour's name made the whole read fail.
    text = (FIXTURES / "discovery" / "lldpd_json0_neighbors.json").read_text()
    text = text.replace('"ns-2.example.com"', '"ns-2\x1f.example.com"')
    (nb,) = fd.parse_lldp_neighbours(text)["eth0"]
    assert nb["sysname"] == "ns-2\\x1f.example.com"


def test_the_json_shape_is_escaped_too():
    text = (FIXTURES / "discovery" / "lldpd_json_neighbors.json").read_text()
    text = text.replace('"ns-2.example.com"', json.dumps("ns-2\n  evil: 1"))
    (nb,) = fd.parse_lldp_neighbours(text)["eth0"]
    assert nb["sysname"] == "ns-2\\n  evil: 1"


# ------------------------------------------------------------------------- the inventory
def test_a_hostile_system_name_writes_no_yaml_of_its_own():
    text = _rendered(HOSTILE)
    data = yaml.safe_load(text)
    seen = _groups_and_hosts(data)
    assert seen["groups"] == {
        "all": [],
        "spark_cluster": [],
        "spark_head": ["spark-1"],
        "spark_workers": ["spark-2", "spark-3"],
    }
    assert "evil" not in seen["groups"]
    for h, hv in seen["hostvars"].items():
        assert set(hv) == {"ansible_host", "ansible_user", "sparkops_fast_links"}, h
    assert "ansible_ssh_common_args" not in json.dumps(data)
    # The switch is still named, escaped, on one comment line.
    (line,) = [ln for ln in text.splitlines() if ln.startswith("# switch ")]
    assert line.startswith('# switch "sw-200g\\\\nevil:\\\\n  hosts:')  # quoted, escaped
    for ln in text.splitlines():
        assert ln.isprintable()


def test_the_hostile_name_in_a_refusal_is_one_printable_line():
    world = _switch_world(HOSTILE)
    world.switch.discard(("spark-3", 1))  # spark-3 off the switch: refused, naming the switch
    with pytest.raises(d.DiscoveryError) as err:
        d.infer(world.nodes(), NAMES, {"speed_mbps": 200000})
    (p,) = [p for p in err.value.problems if "is not on the switch" in p]
    assert '"sw-200g\\\\nevil:' in p and p.isprintable()


def test_a_node_that_answers_for_its_module_is_escaped_on_the_controller():
    # A compromised Spark returns its own "fabric_discover" result: the controller escapes it again.
    nodes = _switch_world("sw-200g").nodes()
    for h in NAMES:
        for port in nodes[h]["ports"]:
            for nb in port["neighbours"]:
                nb["sysname"] = HOSTILE
    text = d.render_inventory(d.infer(nodes, NAMES, {"speed_mbps": 200000}), CONNECTION)
    assert "evil" not in _groups_and_hosts(yaml.safe_load(text))["groups"]
    assert all(ln.isprintable() for ln in text.splitlines())


def test_odd_values_are_quoted_scalars_that_read_back_the_same():
    world = World(names_of(2), [(("spark-1", 1), ("spark-2", 1))])
    conn = {"spark-1": {"ansible_host": "10:20", "ansible_user": "a\n  b: c"}, "spark-2": {"ansible_port": "0x16"}}
    data = yaml.safe_load(d.render_inventory(d.infer(world.nodes(), world.names, {"speed_mbps": 200000}), conn))
    hosts = data["all"]["children"]["spark_cluster"]["children"]
    head = hosts["spark_head"]["hosts"]["spark-1"]
    assert head["ansible_host"] == "10:20"  # not YAML 1.1's sexagesimal 620
    assert head["ansible_user"] == "a\n  b: c"
    assert hosts["spark_workers"]["hosts"]["spark-2"]["ansible_port"] == "0x16"


# ------------------------------------------------------------------- ansible-inventory reads it
def _ansible_inventory() -> str | None:
    here = Path(sys.executable).parent / "ansible-inventory"
    return str(here) if here.is_file() else shutil.which("ansible-inventory")


@pytest.mark.skipif(_ansible_inventory() is None, reason="ansible-inventory is not installed")
def test_ansible_inventory_lists_only_the_discovered_hosts(tmp_path):
    (tmp_path / "hosts.yml").write_text(_rendered(HOSTILE))
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    env = {**os.environ, "ANSIBLE_INVENTORY_ENABLED": "yaml", "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg")}
    res = subprocess.run(  # noqa: S603 - fixed argv, no host contacted
        [_ansible_inventory(), "-i", str(tmp_path / "hosts.yml"), "--list"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    listed = json.loads(res.stdout)
    assert sorted(listed["_meta"]["hostvars"]) == NAMES
    assert "evil" not in listed
    assert {g for g in listed if g not in ("_meta", "ungrouped")} == {
        "all",
        "spark_cluster",
        "spark_head",
        "spark_workers",
    }
    for hv in listed["_meta"]["hostvars"].values():
        assert "ansible_ssh_common_args" not in hv
    assert "[WARNING]" not in res.stderr
