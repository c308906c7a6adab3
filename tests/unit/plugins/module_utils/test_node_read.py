"""node_read: file states, interfaces, side-by-side runs, and the ip/ping outputs recorded on a simulated node
(tests/fixtures/net/, sources in its README.md)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

from ansible_collections.sparkops.cluster.plugins.module_utils import node_read
from conftest import FIXTURES

NET = FIXTURES / "net"


def test_file_state_kind_mode_and_sha1(tmp_path):
    f = tmp_path / "a.conf"
    f.write_bytes(b"x=1\n")
    os.chmod(f, 0o640)
    (tmp_path / "link").symlink_to(f)
    states = node_read.file_states([str(f), str(tmp_path), str(tmp_path / "link"), str(tmp_path / "none")])
    assert states[str(f)] == {
        "exists": True,
        "kind": "file",
        "mode": "0640",
        "sha1": hashlib.sha1(b"x=1\n").hexdigest(),  # noqa: S324
    }
    assert states[str(tmp_path)]["kind"] == "directory" and states[str(tmp_path)]["sha1"] is None
    assert states[str(tmp_path / "link")]["kind"] == "link"
    assert states[str(tmp_path / "none")] == {"exists": False, "kind": None, "mode": None, "sha1": None}


def test_interfaces_from_a_sysfs_tree(tmp_path):
    for name, mtu, state in (("lo", "65536", "unknown"), ("enp1s0f1np1", "9000", "up")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mtu").write_text(mtu + "\n")
        (tmp_path / name / "operstate").write_text(state + "\n")
    (tmp_path / "broken").mkdir()
    got = node_read.interfaces(str(tmp_path))
    assert got["enp1s0f1np1"] == {"mtu": 9000, "operstate": "up"}
    assert got["broken"] == {"mtu": None, "operstate": None}
    assert node_read.interfaces(str(tmp_path / "absent")) == {}


def test_parse_ip_addr_json_recorded_on_a_node():
    got = node_read.parse_ip_addr_json((NET / "ip-j-addr-show.json").read_text())
    assert got["enp1s0f1np1"] == {"mtu": 9000, "ipv4": ["10.213.0.11"]}
    assert got["enP2p1s0f1np1"]["ipv4"] == ["10.213.1.11"]
    assert got["lo"]["ipv4"] == ["127.0.0.1"]
    raw = json.loads((NET / "ip-j-addr-show.json").read_text())
    assert set(got) == {link["ifname"] for link in raw}


def test_ping_argv_fills_the_mtu_through_the_lane():
    argv = node_read.ping_argv("enp1s0f1np1", "10.213.0.12", size=8972, count=3, interval_s=0.2, timeout_s=2)
    assert argv == [
        "ping",
        "-M",
        "do",
        "-s",
        "8972",
        "-c",
        "3",
        "-i",
        "0.2",
        "-W",
        "2",
        "-I",
        "enp1s0f1np1",
        "10.213.0.12",
    ]


def _recorded(case):
    return (
        int((NET / f"ping-{case}.rc").read_text()),
        (NET / f"ping-{case}.stdout").read_text(),
        (NET / f"ping-{case}.stderr").read_text(),
    )


def test_ping_detail_says_why_a_recorded_lane_failed():
    rc, out, err = _recorded("ok")
    assert rc == 0 and "0% packet loss" in out
    rc, out, err = _recorded("mtu")
    assert rc != 0
    assert "message too long" in node_read.ping_detail(out, err).lower()
    rc, out, err = _recorded("loss")
    assert rc != 0
    assert "100% packet loss" in node_read.ping_detail(out, err)


def test_run_side_by_side_takes_the_slowest_not_the_sum_and_kills_at_the_deadline():
    py = sys.executable
    sleep = [py, "-c", "import time; time.sleep(0.5); print('done')"]
    start = time.monotonic()
    got = node_read.run_side_by_side([sleep, sleep, sleep, [py, "-c", "import sys; sys.exit(3)"]], deadline_s=5)
    took = time.monotonic() - start
    assert [g[0] for g in got] == [0, 0, 0, 3] and got[0][1].strip() == "done"
    assert took < 1.4, took
    got = node_read.run_side_by_side([[py, "-c", "import time; time.sleep(30)"], ["/no/such/binary"]], deadline_s=0.5)
    assert got[0][0] is None and "killed after 0.5 s" in got[0][2]
    assert got[1][0] is None and got[1][2]
