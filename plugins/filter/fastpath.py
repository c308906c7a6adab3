"""Filters for the fast-path checks (image CUDA vs driver, sameness across nodes, container RDMA needs, the
NCCL bus-bandwidth gate).

The parsing and version tables live in module_utils (cuda_compat.py); these wrap them for playbooks.
"""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.module_utils.cuda_compat import (
    driver_supports_cuda,
    image_cuda_requirement,
)
from ansible_collections.sparkops.cluster.plugins.module_utils.cuda_compat import (
    same_across_nodes as _same_across_nodes,
)
from ansible_collections.sparkops.cluster.plugins.module_utils.nccl_busbw import (
    DEFAULT_MIN_BYTES,
    DEFAULT_THRESHOLD_GBS,
    busbw_verdict,
    parse_busbw,
)
from ansible_collections.sparkops.cluster.plugins.module_utils.nccl_log import parse_nccl_transport


def image_cuda_check(image_env, driver_version, driver_cuda_version=None, image=""):
    """{status: met|not met|unknown, ok, message} for one image (its Config.Env list) on one driver."""
    req = image_cuda_requirement(image_env or [])
    need = req.get("min_cuda")
    res = driver_supports_cuda(driver_version, need, driver_cuda_version)
    what = f"image {image} " if image else "the image "
    if res.get("status") == "not met":
        message = (
            f"{what}needs CUDA {need} ({res.get('min_driver') or 'a newer driver'} or newer), but the node's driver is "
            f"{driver_version}: {res.get('reason')}. Use an image built for this driver, or move the driver "
            "within the 580 branch"
        )
    elif res.get("status") == "met":
        message = f"{what}needs CUDA {need}; driver {driver_version} provides it"
    else:
        message = f"{what}: {res.get('reason')}"
    return {
        "status": res.get("status"),
        "ok": res.get("ok"),
        "need_cuda": need,
        "message": message,
        "min_driver": res.get("min_driver"),
    }


def same_across_nodes(mapping):
    return _same_across_nodes(dict(mapping or {}))


def container_rdma_gaps(inspect):
    """What a container (its `docker inspect` object) lacks for RDMA; [] when it has it all."""
    host = (inspect or {}).get("HostConfig") or {}
    gaps = []
    devices = [d.get("PathOnHost", "") for d in host.get("Devices") or []]
    if not any(d == "/dev/infiniband" or d.startswith("/dev/infiniband/") for d in devices) and not host.get(
        "Privileged"
    ):
        gaps.append("the RDMA devices (--device=/dev/infiniband)")
    memlock = [u for u in host.get("Ulimits") or [] if u.get("Name") == "memlock"]
    if not memlock or memlock[0].get("Soft") != -1 or memlock[0].get("Hard") != -1:
        gaps.append("unlimited locked memory (--ulimit memlock=-1)")
    if host.get("NetworkMode") != "host":
        gaps.append("the host network (--network=host)")
    env = {e.split("=", 1)[0] for e in ((inspect or {}).get("Config") or {}).get("Env") or []}
    for var in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME"):
        if var not in env:
            gaps.append(f"{var} from the fabric env file")
    return gaps


def nccl_busbw_verdict(text, threshold_gbs=DEFAULT_THRESHOLD_GBS, min_bytes=DEFAULT_MIN_BYTES):
    """{verdict: PASS|FAIL, peak_busbw_gbs, message, world_size, rows} for the probe's (or nccl-tests') output."""
    parsed = parse_busbw(str(text or ""))
    # The probe's output carries NCCL's INFO lines: what the channels really used.
    transports = parse_nccl_transport(str(text or "")).get("transports")
    verdict = busbw_verdict(parsed, float(threshold_gbs), int(min_bytes), transports)
    return {**verdict, "world_size": parsed.get("world_size"), "rows": len(parsed.get("rows") or [])}


class FilterModule:
    def filters(self):
        return {
            "image_cuda_check": image_cuda_check,
            "same_across_nodes": same_across_nodes,
            "container_rdma_gaps": container_rdma_gaps,
            "nccl_busbw_verdict": nccl_busbw_verdict,
        }
