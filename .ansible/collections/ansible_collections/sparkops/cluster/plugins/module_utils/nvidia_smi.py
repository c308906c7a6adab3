# Copyright: sparkops maintainers
# Apache-2.0
"""Parse `nvidia-smi` output and /proc/driver/nvidia/version (standard library only).

Formats handled (fixtures in tests/fixtures/nvidia_smi/, sources in its README.md):
- `nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`: one comma-separated row per GPU,
  in the order of the fields asked for. Values the GPU cannot report come back as "[N/A]" (a GB10
  reports memory.total and memory.used so: unified memory has no separate VRAM pool) or
  "[Not Supported]". Without `nounits` numbers carry units ("81559 MiB", "3 %"); with `csv` alone a
  header line ("index, name, ..., memory.total [MiB]") comes first. Both are tolerated.
- The plain `nvidia-smi` banner: "| NVIDIA-SMI 580.142   Driver Version: 580.142   CUDA Version: 13.0 |".
  "CUDA Version" is the newest CUDA the driver supports, not an installed toolkit.
- /proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.126.09  ..."
  (open modules) or "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.82.07  ..." (proprietary).
- Failures: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. ..." (no
  module loaded: treat as no GPU), "Failed to initialize NVML: Driver/library version mismatch" (the
  loaded module and the user-space library differ, typically after a driver update without a reboot),
  'Field "foo" is not a valid field to query.' (rc 2).
"""

from __future__ import annotations

import re

# The fields gpu_facts asks for, in this order (the order of the recorded H100 query fixture).
QUERY_FIELDS = (
    "driver_version",
    "name",
    "compute_cap",
    "memory.total",
    "memory.used",
    "pci.bus_id",
    "uuid",
    "index",
)

_UNAVAILABLE = {"[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", ""}
_UNIT_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*(?:MiB|%|W|MHz|C)?\s*$")
_BANNER_RE = re.compile(
    r"NVIDIA-SMI\s+(?P<smi>[\d.]+)\s+Driver Version:\s+(?P<driver>[\d.]+)(?:\s+CUDA Version:\s+(?P<cuda>[\d.]+|N/A))?"
)
_NVRM_RE = re.compile(
    r"NVRM version:\s+NVIDIA UNIX\s+(?:(?P<open>Open) Kernel Module for (?P<arch1>\S+)|(?P<arch2>\S+) Kernel Module)"
    r"\s+(?P<version>\d+\.\d+(?:\.\d+)?)"
)
_NO_DRIVER_MARKERS = (
    "couldn't communicate with the nvidia driver",
    "no devices were found",
    "unable to determine the device handle",
)
_MISMATCH_MARKER = "driver/library version mismatch"


class NvidiaSmiError(ValueError):
    """Output that is an nvidia-smi error or not the expected format."""


def query_args(fields=QUERY_FIELDS) -> list[str]:
    """Arguments (after the nvidia-smi path) for the machine-readable query."""
    return [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]


def no_driver_reason(text: str) -> str | None:
    """The reason to report 'no GPU' (not a failure) when nvidia-smi's output says so, else None."""
    low = (text or "").lower()
    for marker in _NO_DRIVER_MARKERS:
        if marker in low:
            line = next((ln.strip() for ln in text.splitlines() if marker in ln.lower()), text.strip())
            return f"nvidia-smi: {line}"
    return None


def driver_mismatch(text: str) -> str | None:
    """The NVML library version when the output reports a driver/library mismatch ('' when not printed)."""
    low = (text or "").lower()
    if _MISMATCH_MARKER not in low:
        return None
    m = re.search(r"NVML library version:\s*([\d.]+)", text)
    return m.group(1) if m else ""


def _value(raw: str):
    raw = raw.strip()
    return None if raw.lower() in _UNAVAILABLE else raw


def parse_query_csv(text: str, fields=QUERY_FIELDS) -> list[dict]:
    """Rows of a --query-gpu csv output -> list of {field: value or None}; raise NvidiaSmiError."""
    fields = tuple(fields)
    rows = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        header = [re.sub(r"\s*\[.*\]$", "", c) for c in cells]
        if tuple(header) == fields:
            continue  # `--format=csv` header line
        if len(cells) != len(fields):
            want = f"{len(fields)} comma-separated values ({', '.join(fields)})"
            raise NvidiaSmiError(f"expected {want}, got {len(cells)}: {line.strip()!r}")
        rows.append({f: _value(c) for f, c in zip(fields, cells, strict=True)})
    if not rows:
        raise NvidiaSmiError("nvidia-smi printed no GPU rows")
    return rows


def _number(value):
    if value is None:
        return None
    m = _UNIT_RE.match(value)
    if not m:
        return None
    num = float(m.group(1))
    return int(num) if num.is_integer() else num


def gpus_from_rows(rows: list[dict]) -> list[dict]:
    """Normalise parse_query_csv rows into gpu_facts' per-GPU dicts."""
    gpus = []
    for pos, row in enumerate(rows):
        index = _number(row.get("index"))
        gpus.append(
            {
                "index": index if index is not None else pos,
                "name": row.get("name"),
                "driver_version": row.get("driver_version"),
                "compute_capability": row.get("compute_cap"),
                "memory_total_mib": _number(row.get("memory.total")),
                "memory_used_mib": _number(row.get("memory.used")),
                "uuid": row.get("uuid"),
                "pci_bus_id": row.get("pci.bus_id"),
            }
        )
    return gpus


def parse_banner(text: str) -> dict:
    """Plain `nvidia-smi` (or `nvidia-smi -q`) output -> {smi_version, driver_version, cuda_driver_version}."""
    m = _BANNER_RE.search(text or "")
    if m:
        cuda = m.group("cuda")
        return {
            "smi_version": m.group("smi"),
            "driver_version": m.group("driver"),
            "cuda_driver_version": None if cuda in (None, "N/A") else cuda,
        }
    # `nvidia-smi -q`: "Driver Version    : 580.159.04" / "CUDA Version      : 13.0"
    drv = re.search(r"^Driver Version\s*:\s*([\d.]+)", text or "", re.M)
    cuda = re.search(r"^CUDA Version\s*:\s*([\d.]+)", text or "", re.M)
    return {
        "smi_version": None,
        "driver_version": drv.group(1) if drv else None,
        "cuda_driver_version": cuda.group(1) if cuda else None,
    }


def parse_proc_version(text: str) -> dict:
    """/proc/driver/nvidia/version -> {kernel_module_version, kernel_module_flavor ('open'|'proprietary'), arch}."""
    m = _NVRM_RE.search(text or "")
    if not m:
        return {"kernel_module_version": None, "kernel_module_flavor": None, "arch": None}
    return {
        "kernel_module_version": m.group("version"),
        "kernel_module_flavor": "open" if m.group("open") else "proprietary",
        "arch": m.group("arch1") or m.group("arch2"),
    }


def driver_branch(version: str | None) -> str | None:
    """'580.159.04' -> '580'; None for None or text that is not a driver version."""
    if not version:
        return None
    m = re.match(r"^\s*(\d+)\.\d+", version)
    return m.group(1) if m else None


def branch_status(expected_branch: str, *versions) -> dict:
    """Whether every known version (user-space driver, kernel module) is on expected_branch.

    Returns {on_branch, branches, reason}; on_branch is False when no version is known.
    """
    known = [v for v in versions if v]
    branches = sorted({driver_branch(v) for v in known if driver_branch(v)})
    if not known:
        return {"on_branch": False, "branches": [], "reason": "no NVIDIA driver version could be read"}
    off = [v for v in known if driver_branch(v) != str(expected_branch)]
    if off:
        return {
            "on_branch": False,
            "branches": branches,
            "reason": f"driver {', '.join(sorted(set(off)))} is not on the {expected_branch} branch",
        }
    return {"on_branch": True, "branches": branches, "reason": None}
