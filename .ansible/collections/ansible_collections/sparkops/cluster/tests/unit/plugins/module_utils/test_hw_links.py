"""hw_links parsers on recorded real outputs (tests/fixtures/hw/README.md says where each comes from)."""

from __future__ import annotations

import shlex
from pathlib import Path

from ansible_collections.sparkops.cluster.plugins.module_utils import hw_links as hw

FIX = Path(__file__).resolve().parents[3] / "fixtures" / "hw"


def read(name: str) -> str:
    return (FIX / name).read_text()


def test_clocks_idle_h100():
    (gpu,) = hw.parse_nvidia_smi_clocks(read("h100_580.159.04_clock_performance_idle.txt"))
    assert gpu["bus_id"] == "00000000:00:06.0"
    assert gpu["pstate"] == "P0"
    assert gpu["reasons_active"] == ["Idle"]
    assert gpu["clocks_mhz"]["Graphics"] == 375
    assert gpu["max_clocks_mhz"]["Graphics"] == 1980


def test_clocks_under_load_h100_names_power_cap():
    (gpu,) = hw.parse_nvidia_smi_clocks(read("h100_580.159.04_clock_performance_load.txt"))
    assert gpu["reasons_active"] == ["SW Power Cap"]
    assert gpu["clocks_mhz"]["SM"] == 1305
    # "Applications Clocks" must not overwrite the live clocks.
    assert gpu["clocks_mhz"]["Graphics"] == 1305


def test_sysfs_links_recorded():
    rows = {}
    for line in read("h100_vm_sysfs_pci_links.txt").splitlines():
        bdf, rest = line.split(" ", 1)
        attrs = dict(kv.split("=", 1) for kv in shlex.split(rest))
        rows[bdf] = hw.parse_sysfs_link(
            {
                "current_link_speed": attrs["cur_speed"],
                "current_link_width": attrs["cur_width"],
                "max_link_speed": attrs["max_speed"],
                "max_link_width": attrs["max_width"],
            }
        )
    assert rows["0000:00:06.0"] == {"sta_speed_gts": 32.0, "sta_width": 16, "cap_speed_gts": 32.0, "cap_width": 16}
    # A virtio function has no PCIe link: nothing is made up.
    assert rows["0000:00:01.0"]["sta_width"] is None


def test_lspci_cx7_unknown_cap_speed():
    (dev,) = hw.parse_lspci_links(read("lshca-issue51_cx7_lspci_excerpt.txt"))
    assert dev["cap_speed_gts"] is None and dev["cap_width"] == 16
    assert dev["sta_speed_gts"] == 16.0 and dev["sta_width"] == 16
    assert dev["sta_downgraded"] is False


def test_lspci_narrow_link():
    (dev,) = hw.parse_lspci_links(read("rpi-pcie-issue143_cx3_lspci_excerpt.txt"))
    assert (dev["cap_width"], dev["sta_width"]) == (4, 1)
    assert (dev["cap_speed_gts"], dev["sta_speed_gts"]) == (8.0, 5.0)


def test_lspci_header_with_domain_starts_a_device():
    text = (
        read("rpi-pcie-issue675_rtl8126_lspci_header.txt")
        + "\t\tLnkSta:\tSpeed 5GT/s (downgraded), Width x2 (downgraded)\n"
    )
    (dev,) = hw.parse_lspci_links(text)
    assert dev["bdf"] == "0000:01:00.0"
    assert dev["sta_width"] == 2 and dev["sta_downgraded"] is True


def test_ibstat_gb10_firmware_per_function():
    fw = hw.parse_ibstat_firmware(read("sbc-reviews-issue92_gb10_ibstat_partial.txt"))
    assert fw == {"roceP2p1s0f0": "28.45.4028", "roceP2p1s0f1": "28.45.4028", "rocep1s0f0": "28.45.4028"}


def test_version_key_orders_firmware():
    assert hw.version_key("28.39.3560") < hw.version_key("28.45.4028") < hw.version_key("28.45.10000")
