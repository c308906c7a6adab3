# Copyright: sparkops maintainers
# Apache-2.0
"""Parse what the day-2 doctor reads from the hardware (standard library only).

Formats (fixtures in tests/fixtures/hw/, sources in its README.md):
- PCIe link of a function from sysfs: /sys/bus/pci/devices/<bdf>/{current,max}_link_{speed,width}
  ("32.0 GT/s PCIe", "16"); what the kernel reads from the Link Status/Capabilities registers.
- The same from `lspci -vv`: "LnkCap: Port #0, Speed 16GT/s, Width x4, ..." and
  "LnkSta: Speed 5GT/s (downgraded), Width x2 (downgraded)"; older lspci omit "(ok)/(downgraded)".
- ConnectX firmware: `ibstat` ("CA 'rocep1s0f1'" blocks with "Firmware version: 28.45.4028"),
  /sys/class/infiniband/<dev>/fw_ver ("28.45.4028", what the module reads).
- GPU clocks: `nvidia-smi -q -d CLOCK,PERFORMANCE` ("Clocks Event Reasons" with Active/Not Active
  entries, "Clocks" and "Max Clocks" sections in MHz).
"""

from __future__ import annotations

import re

_LNK_RE = re.compile(r"^\s*(LnkCap|LnkSta):\s*(.*)$")
_SPEED_RE = re.compile(r"Speed\s+([0-9.]+GT/s|unknown)(?:\s*\((ok|downgraded)\))?")
_WIDTH_RE = re.compile(r"Width\s+x(\d+)(?:\s*\((ok|downgraded)\))?")
_BDF_RE = re.compile(r"^([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\s")


def gts(value: str | None) -> float | None:
    """'32GT/s' or '32.0 GT/s PCIe' -> 32.0; None when unknown."""
    if not value:
        return None
    m = re.match(r"\s*([0-9.]+)\s*GT/s", value)
    return float(m.group(1)) if m else None


def parse_lspci_links(text: str) -> list[dict]:
    """One entry per device of `lspci -vv`: bdf, name, cap/sta speed (GT/s) and width."""
    devices: list[dict] = []
    cur: dict | None = None
    for raw in text.splitlines():
        line = raw.lstrip("> ")
        if _BDF_RE.match(line):
            bdf, _sep, name = line.partition(" ")
            cur = {"bdf": bdf, "name": name.strip()}
            devices.append(cur)
            continue
        m = _LNK_RE.match(line)
        if not m:
            continue
        if cur is None:  # an excerpt without its device header
            cur = {"bdf": None, "name": ""}
            devices.append(cur)
        kind = "cap" if m.group(1) == "LnkCap" else "sta"
        sp = _SPEED_RE.search(m.group(2))
        wd = _WIDTH_RE.search(m.group(2))
        cur[f"{kind}_speed_gts"] = gts(sp.group(1)) if sp else None
        cur[f"{kind}_width"] = int(wd.group(1)) if wd else None
        if kind == "sta":
            cur["sta_downgraded"] = bool((sp and sp.group(2) == "downgraded") or (wd and wd.group(2) == "downgraded"))
    return [d for d in devices if "sta_width" in d or "cap_width" in d]


def parse_sysfs_link(attrs: dict) -> dict:
    """attrs: the four sysfs files' contents (missing ones absent or empty)."""

    def width(v):
        v = (v or "").strip()
        return int(v) if v.isdigit() and int(v) > 0 else None

    return {
        "sta_speed_gts": gts(attrs.get("current_link_speed")),
        "sta_width": width(attrs.get("current_link_width")),
        "cap_speed_gts": gts(attrs.get("max_link_speed")),
        "cap_width": width(attrs.get("max_link_width")),
    }


def parse_ibstat_firmware(text: str) -> dict:
    """`ibstat` -> {ca_name: firmware version}."""
    out: dict = {}
    ca = None
    for line in text.splitlines():
        m = re.match(r"^CA '([^']+)'", line.strip())
        if m:
            ca = m.group(1)
            continue
        m = re.match(r"^Firmware version:\s*(\S+)", line.strip())
        if m and ca:
            out[ca] = m.group(1)
    return out


def version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.\-]", version or ""))


def parse_nvidia_smi_clocks(text: str) -> list[dict]:
    """`nvidia-smi -q -d CLOCK,PERFORMANCE` -> per GPU: pstate, active event reasons, clocks, max clocks."""
    gpus: list[dict] = []
    gpu = None
    section = None
    for raw in text.splitlines():
        if not raw.strip():
            continue
        m = re.match(r"^GPU ([0-9A-Fa-f:.]+)\s*$", raw)
        if m:
            gpu = {"bus_id": m.group(1), "pstate": None, "reasons_active": [], "clocks_mhz": {}, "max_clocks_mhz": {}}
            gpus.append(gpu)
            continue
        if gpu is None:
            continue
        indent = len(raw) - len(raw.lstrip())
        key, sep, val = raw.strip().partition(":")
        key, val = key.strip(), val.strip()
        if indent <= 4:
            section = key if not sep or not val else None
            if key == "Performance State":
                gpu["pstate"] = val
            continue
        if section in ("Clocks Event Reasons", "Clocks Throttle Reasons") and val in ("Active", "Not Active"):
            if val == "Active":
                gpu["reasons_active"].append(key)
        elif section in ("Clocks", "Max Clocks"):
            m = re.match(r"(\d+)\s*MHz", val)
            if m:
                gpu["clocks_mhz" if section == "Clocks" else "max_clocks_mhz"][key] = int(m.group(1))
    return gpus
