# Copyright: sparkops maintainers
# Apache-2.0
"""Image CUDA requirement vs host driver, and "same on every node" checks (standard library only).

An NVIDIA CUDA image declares what it needs in its environment:
- NVIDIA_REQUIRE_CUDA, read by nvidia-container-cli before the container starts, e.g.
  "cuda>=13.0 brand=unknown,driver>=535,driver<536 brand=grid,driver>=535,driver<536 ...".
  Space-separated alternatives are ORed, comma-separated constraints ANDed; the brand clauses admit
  datacenter drivers of an older branch through the forward-compatibility package and do not apply to a
  DGX Spark. When no alternative holds the container fails to start ("requirement error: unsatisfied
  condition: cuda>=13.0, please update your driver").
- CUDA_VERSION, e.g. "13.0.2"; NVIDIA_DISABLE_REQUIRE=1 turns the check off.

Minimum Linux driver per CUDA release (the driver each toolkit GA ships with), from NVIDIA's CUDA Toolkit
Release Notes, "CUDA Toolkit and Corresponding Driver Versions"
(https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html); the installer file names carry the
same numbers (cuda_12.9.0_575.51.03_linux.run). Minor-version compatibility (CUDA 12.x on >= 525, 13.x on
>= 580, https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html) lets some
applications run on an older driver of the same major, but nvidia-container-cli compares NVIDIA_REQUIRE_CUDA
against the CUDA version the driver reports, so an image wanting CUDA 13.1 does not start on a 580 driver.
"""

from __future__ import annotations

import contextlib
import re

# CUDA major.minor -> minimum Linux x86_64/arm64-sbsa driver (GA release of that CUDA version).
MIN_DRIVER = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.1": "530.30.02",
    "12.2": "535.54.03",
    "12.3": "545.23.06",
    "12.4": "550.54.14",
    "12.5": "555.42.02",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
    "13.1": "590.44.01",
}

_CUDA_CONSTRAINT_RE = re.compile(r"^cuda\s*(>=|>|=|==)\s*(\d+(?:\.\d+)*)$")
_DRIVER_CONSTRAINT_RE = re.compile(r"^driver\s*(>=|>|<=|<|=|==)\s*(\d+(?:\.\d+)*)$")


def version_tuple(version) -> tuple[int, ...]:
    """'580.95.05' -> (580, 95, 5); ignores anything after the numeric part."""
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", str(version or ""))
    if not m:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(x) for x in m.group(1).split("."))


def major_minor(version) -> str:
    t = version_tuple(version)
    return f"{t[0]}.{t[1] if len(t) > 1 else 0}"


def _env_map(env_list_or_labels) -> dict:
    """docker inspect .Config.Env (["K=V", ...]) or a dict (env or labels) -> dict."""
    if not env_list_or_labels:
        return {}
    if isinstance(env_list_or_labels, dict):
        return {str(k): "" if v is None else str(v) for k, v in env_list_or_labels.items()}
    env = {}
    for item in env_list_or_labels:
        key, sep, value = str(item).partition("=")
        if sep:
            env[key.strip()] = value
    return env


def parse_require_cuda(text: str) -> list[list[dict]]:
    """NVIDIA_REQUIRE_CUDA -> alternatives, each a list of {kind, op, value}; kind: cuda, driver, brand, arch, other."""
    alternatives = []
    for clause in (text or "").split():
        constraints = []
        for raw in clause.split(","):
            part = raw.strip()
            if not part:
                continue
            cm = _CUDA_CONSTRAINT_RE.match(part)
            dm = _DRIVER_CONSTRAINT_RE.match(part)
            if cm:
                constraints.append({"kind": "cuda", "op": cm.group(1), "value": cm.group(2)})
            elif dm:
                constraints.append({"kind": "driver", "op": dm.group(1), "value": dm.group(2)})
            elif "=" in part:
                key, _sep, value = part.partition("=")
                kind = key.strip() if key.strip() in ("brand", "arch") else "other"
                constraints.append({"kind": kind, "op": "=", "value": value.strip()})
            else:
                constraints.append({"kind": "other", "op": "", "value": part})
        if constraints:
            alternatives.append(constraints)
    return alternatives


def image_cuda_requirement(env_list_or_labels) -> dict:
    """An image's env (list of K=V) or labels (dict) -> {cuda_version, min_cuda, require_cuda, min_driver, ...}.

    min_cuda is the major.minor the image needs (the brand-free cuda>= clause of NVIDIA_REQUIRE_CUDA, else
    CUDA_VERSION); min_driver a brand-free driver>= constraint when the image states one; source says where
    min_cuda came from; disabled is true when NVIDIA_DISABLE_REQUIRE is set.
    """
    env = _env_map(env_list_or_labels)
    require = env.get("NVIDIA_REQUIRE_CUDA")
    cuda_version = env.get("CUDA_VERSION") or env.get("com.nvidia.cuda.version") or None
    disabled = (env.get("NVIDIA_DISABLE_REQUIRE") or "").strip().lower() in ("1", "true", "yes")
    alternatives = parse_require_cuda(require) if require else []
    min_cuda, min_driver, source = None, None, None
    brand_clauses = []
    for constraints in alternatives:
        kinds = {c["kind"] for c in constraints}
        if "brand" in kinds:
            brand_clauses.append(",".join(f"{c['kind']}{c['op']}{c['value']}" for c in constraints))
            continue
        for c in constraints:
            if c["kind"] == "cuda" and min_cuda is None:
                min_cuda, source = major_minor(c["value"]), "NVIDIA_REQUIRE_CUDA"
            if c["kind"] == "driver" and c["op"] in (">=", ">") and min_driver is None:
                min_driver = c["value"]
    if min_cuda is None and cuda_version:
        with contextlib.suppress(ValueError):
            min_cuda, source = major_minor(cuda_version), "CUDA_VERSION"
    return {
        "cuda_version": cuda_version,
        "require_cuda": require,
        "min_cuda": min_cuda,
        "min_driver": min_driver,
        "brand_clauses": brand_clauses,
        "disabled": disabled,
        "source": source,
    }


def min_driver_for_cuda(cuda_version) -> str | None:
    """Minimum driver for a CUDA major.minor from MIN_DRIVER; None when the table has no entry."""
    try:
        return MIN_DRIVER.get(major_minor(cuda_version))
    except ValueError:
        return None


def driver_supports_cuda(driver_version, cuda_version, driver_cuda_version=None) -> dict:
    """Whether a host driver can start an image needing cuda_version (major.minor is what counts).

    driver_cuda_version, when known (nvidia-smi's "CUDA Version: 13.0"), is what nvidia-container-cli compares
    against and decides; otherwise the MIN_DRIVER table does. Returns {ok, status, min_driver, reason}: status
    "met", "not met" (naming both versions) or "unknown" (no requirement, no driver version, or a CUDA version
    the table does not know); ok is None when unknown.
    """
    if not cuda_version:
        return {
            "ok": None,
            "status": "unknown",
            "min_driver": None,
            "reason": "no CUDA requirement found (the image sets neither NVIDIA_REQUIRE_CUDA nor CUDA_VERSION)",
        }
    try:
        need = major_minor(cuda_version)
    except ValueError:
        return {
            "ok": None,
            "status": "unknown",
            "min_driver": None,
            "reason": f"unreadable CUDA version {cuda_version!r}",
        }
    min_driver = MIN_DRIVER.get(need)
    if driver_cuda_version:
        try:
            have = major_minor(driver_cuda_version)
        except ValueError:
            have = None
        if have:
            ok = version_tuple(have) >= version_tuple(need)
            drv = f"driver {driver_version}" if driver_version else "the driver"
            at_least = f" (CUDA {need} needs driver >= {min_driver})" if min_driver else ""
            if ok:
                reason = f"{drv} supports CUDA up to {have}; the image needs CUDA {need}"
            else:
                reason = f"{drv} supports CUDA up to {have}, but the image needs CUDA {need}{at_least}"
            return {"ok": ok, "status": "met" if ok else "not met", "min_driver": min_driver, "reason": reason}
    if not driver_version:
        return {"ok": None, "status": "unknown", "min_driver": min_driver, "reason": "host driver version unknown"}
    if min_driver is None:
        return {
            "ok": None,
            "status": "unknown",
            "min_driver": None,
            "reason": f"no minimum driver known for CUDA {need}; compare nvidia-smi's CUDA Version instead",
        }
    try:
        ok = version_tuple(driver_version) >= version_tuple(min_driver)
    except ValueError:
        return {
            "ok": None,
            "status": "unknown",
            "min_driver": min_driver,
            "reason": f"unreadable driver {driver_version!r}",
        }
    if ok:
        reason = f"driver {driver_version} >= {min_driver}, the minimum for CUDA {need}"
    else:
        reason = f"driver {driver_version} is older than {min_driver}, the minimum for the image's CUDA {need}"
    return {"ok": ok, "status": "met" if ok else "not met", "min_driver": min_driver, "reason": reason}


def same_across_nodes(mapping_node_to_value: dict) -> dict:
    """{node: value} -> {ok, value, values, odd_nodes, missing, message} for "every node runs the same X" checks.

    value is the majority value (ties broken by the sorted value); odd_nodes are the nodes with another value;
    missing the nodes with no value (None or ""). ok needs one value on every node.
    """
    values: dict[str, list] = {}
    missing = []
    for node, value in sorted((mapping_node_to_value or {}).items(), key=lambda kv: str(kv[0])):
        if value is None or value == "":
            missing.append(node)
            continue
        values.setdefault(str(value), []).append(node)
    if not values:
        return {
            "ok": False,
            "value": None,
            "values": {},
            "odd_nodes": [],
            "missing": missing,
            "message": "no node reported a value",
        }
    majority = sorted(values, key=lambda v: (-len(values[v]), v))[0]
    odd = sorted((n for v, nodes in values.items() if v != majority for n in nodes), key=str)
    ok = not odd and not missing
    if ok:
        message = f"all {len(values[majority])} node(s) have {majority}"
    else:
        parts = [f"{n} has {v}" for v, nodes in sorted(values.items()) if v != majority for n in nodes]
        parts += [f"{n} reported nothing" for n in missing]
        message = f"{len(values[majority])} node(s) have {majority}; " + ", ".join(parts)
    return {"ok": ok, "value": majority, "values": values, "odd_nodes": odd, "missing": missing, "message": message}
