# Copyright: sparkops maintainers
# Apache-2.0
"""Day-2 judgements, controller side: the memory plan and the doctor's verdicts.

Every check returns one dict: check, scope (a node or "cluster"), verdict (PASS, WARN, CRITICAL, or
N/A where the check cannot apply, with the reason), evidence (what was seen) and action (what a person
does next: a command, a cable, a variable). Pure functions over data the doctor playbook gathered;
unit-tested in tests/unit/plugins/plugin_utils/test_day2_checks.py.
"""

from __future__ import annotations

import re

from ansible_collections.sparkops.cluster.plugins.module_utils.hw_links import version_key
from ansible_collections.sparkops.cluster.plugins.plugin_utils.discovery import DiscoveryError, infer, moved_cables

PASS, WARN, CRITICAL, NA = "PASS", "WARN", "CRITICAL", "N/A"
_RANK = {NA: 0, PASS: 1, WARN: 2, CRITICAL: 3}
GIB = 2**30


def verdict(check: str, scope: str, level: str, evidence: str, action: str = "") -> dict:
    return {"check": check, "scope": scope, "verdict": level, "evidence": evidence, "action": action}


def overall(verdicts: list[dict]) -> str:
    worst = max((_RANK[v["verdict"]] for v in verdicts), default=_RANK[PASS])
    return {0: PASS, 1: PASS, 2: WARN, 3: CRITICAL}[worst]


# --------------------------------------------------------------------------- preflight
def memory_plan_problems(profile: dict, node_memory_gib: float, overhead_gib: float, floor_gib: float) -> list[str]:
    """What a node keeps free under the profile: memory x (1 - utilisation) - overhead >= floor."""
    util = float(profile.get("gpu_memory_utilization", 0.9))
    if floor_gib < 0 or overhead_gib < 0 or node_memory_gib <= 0:
        return [
            f"memory settings must be positive (node {node_memory_gib}, overhead {overhead_gib}, floor {floor_gib} GiB)"
        ]
    left = node_memory_gib * (1 - util) - overhead_gib
    if left < floor_gib:
        need = 1 - (floor_gib + overhead_gib) / node_memory_gib
        return [
            f"gpu_memory_utilization {util} leaves {left:.1f} GiB of {node_memory_gib:g} GiB for the OS after "
            f"{overhead_gib:g} GiB of host processes, below the memory floor of {floor_gib:g} GiB "
            f"(sparkops_memory_floor_gib); lower gpu_memory_utilization to {max(need, 0):.2f} or less"
        ]
    return []


# --------------------------------------------------------------------------- node checks
def check_driver(node: str, gpu: dict, branch: str) -> dict:
    if not gpu.get("gpu_present"):
        return verdict("driver branch", node, NA, f"not applicable: {gpu.get('reason') or 'no GPU'}")
    ver = gpu.get("driver_version") or gpu.get("kernel_module_version") or "?"
    if gpu.get("on_branch"):
        return verdict("driver branch", node, PASS, f"driver {ver} on branch {branch}")
    return verdict(
        "driver branch",
        node,
        CRITICAL,
        f"driver {ver}: {gpu.get('branch_reason') or 'off branch ' + branch}",
        f"ansible-playbook playbooks/upgrade.yml -e nvidia_driver_version=<{branch}.x> "
        "-e nvidia_driver_allow_reboot=true",
    )


def check_kernel(node: str, kernel: str, known_bad: list[dict]) -> dict:
    for bad in known_bad or []:
        if bad.get("version") == kernel:
            return verdict(
                "kernel",
                node,
                CRITICAL,
                f"kernel {kernel} is known bad: {bad.get('reason', '')}",
                f"boot the previous kernel (grub, Advanced options), then `apt purge linux-image-{kernel}`",
            )
    return verdict("kernel", node, PASS, f"kernel {kernel or '?'} is not on the known-bad list")


def check_nic(node: str, functions: list[dict], hardware: str, expected_width: int, min_firmware: str) -> dict:
    """functions: [{device, bdf, firmware, sta_width, cap_width, sta_speed_gts, cap_speed_gts}]."""
    if not functions:
        level = NA if hardware != "dgx_spark" else CRITICAL
        ev = "not applicable: no RDMA device (simulated node)" if level == NA else "no ConnectX-7 function found"
        return verdict(
            "NIC firmware and PCIe width",
            node,
            level,
            ev,
            "" if level == NA else "check `ibdev2netdev` and `lspci | grep Mellanox`",
        )
    problems, warns, seen = [], [], []
    fws = {f.get("firmware") for f in functions if f.get("firmware")}
    for f in functions:
        w, cap = f.get("sta_width"), f.get("cap_width")
        seen.append(f"{f['device']} fw {f.get('firmware') or '?'} x{w or '?'} @ {f.get('sta_speed_gts') or '?'} GT/s")
        if w is not None and (w < expected_width or (cap and w < cap)):
            problems.append(f"{f['device']} ({f.get('bdf')}) runs PCIe x{w}, needs x{max(expected_width, cap or 0)}")
        if f.get("firmware") and min_firmware and version_key(f["firmware"]) < version_key(min_firmware):
            warns.append(f"{f['device']} firmware {f['firmware']} older than {min_firmware}")
    if len(fws) > 1:
        warns.append(f"functions run different firmware: {', '.join(sorted(fws))}")
    ev = "; ".join(seen)
    if problems:
        return verdict(
            "NIC firmware and PCIe width",
            node,
            CRITICAL,
            "; ".join(problems) + f" [{ev}]",
            "update the ConnectX-7 firmware (DGX OS updates: `sudo fwupdmgr update`), then power-cycle the Spark "
            "(a warm reboot does not retrain the link)",
        )
    if warns:
        return verdict(
            "NIC firmware and PCIe width",
            node,
            WARN,
            "; ".join(warns) + f" [{ev}]",
            "`sudo fwupdmgr update` on this node",
        )
    return verdict("NIC firmware and PCIe width", node, PASS, ev)


# Reasons that mean the GPU is held back by heat or power delivery, not by its own idleness.
_BAD_REASONS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown", "SW Thermal Slowdown")


def check_gpu_clocks(node: str, gpus: list[dict] | None, reason: str = "") -> dict:
    if not gpus:
        return verdict("GPU clocks and throttle reasons", node, NA, f"not applicable: {reason or 'no GPU'}")
    out = []
    level = PASS
    for g in gpus:
        cur = g["clocks_mhz"].get("Graphics") or g["clocks_mhz"].get("SM")
        top = g["max_clocks_mhz"].get("Graphics") or g["max_clocks_mhz"].get("SM")
        reasons = g.get("reasons_active", [])
        busy = "Idle" not in reasons
        bad = [r for r in reasons if r in _BAD_REASONS]
        out.append(f"{g['bus_id']}: {cur} of {top} MHz, {g.get('pstate')}, active: {', '.join(reasons) or 'none'}")
        if busy and cur and top and cur < 0.5 * top:
            level = CRITICAL
        elif bad and level != CRITICAL:
            level = WARN
    action = ""
    if level != PASS:
        action = (
            "check airflow and the power supply (GB10 drops to ~0.7 GHz when held back); "
            "`nvidia-smi -q -d PERFORMANCE` under load"
        )
    return verdict("GPU clocks and throttle reasons", node, level, "; ".join(out), action)


def check_memory(node: str, available_bytes: int | None, floor_gib: float, floor_marker: dict | None) -> dict:
    if floor_marker:
        return verdict(
            "memory headroom",
            node,
            CRITICAL,
            f"memory floor crossed at {floor_marker.get('at')}: "
            f"{int(floor_marker.get('available_bytes', 0)) // 2**20} MiB free "
            f"< {int(floor_marker.get('floor_bytes', 0)) // 2**20} MiB; {floor_marker.get('stopped')} was stopped",
            "find what ate the memory (`ps aux --sort=-rss | head`), lower gpu_memory_utilization if it was vLLM, "
            "then `ansible-playbook site.yml` (restarts the group and re-arms the floor)",
        )
    if available_bytes is None:
        return verdict(
            "memory headroom", node, WARN, "free memory could not be read", "check /proc/meminfo on the node"
        )
    floor = floor_gib * GIB
    ev = f"{available_bytes / GIB:.1f} GiB free, floor {floor_gib:g} GiB"
    if available_bytes < floor:
        return verdict(
            "memory headroom", node, CRITICAL, ev, "stop what uses memory; the watchdog stops vLLM at the floor"
        )
    if available_bytes < 1.5 * floor:
        return verdict("memory headroom", node, WARN, ev, "lower gpu_memory_utilization or sparkops_memory_floor_gib")
    return verdict("memory headroom", node, PASS, ev)


def check_disk(node: str, free_bytes: int | None, headroom_gib: float, path: str) -> dict:
    if free_bytes is None:
        return verdict("disk for the weights", node, WARN, f"free space at {path} unknown", f"df -h {path}")
    ev = f"{free_bytes / GIB:.1f} GiB free at {path}, headroom wanted {headroom_gib:g} GiB"
    if free_bytes < headroom_gib * GIB:
        return verdict(
            "disk for the weights", node, WARN, ev, f"free space under {path} (old revisions: `hf cache scan`)"
        )
    return verdict("disk for the weights", node, PASS, ev)


def check_gids(node: str, rdma: dict) -> dict:
    if not rdma.get("rdma_present"):
        return verdict("RDMA GIDs", node, NA, f"not applicable: {rdma.get('reason') or 'no RDMA device'}")
    if rdma.get("gid_ok"):
        return verdict("RDMA GIDs", node, PASS, "RoCE v2 GID of every fast-link address in place")
    bad = [f"{k}: {v.get('reason')}" for k, v in (rdma.get("gid_checks") or {}).items() if not v.get("ok", False)]
    return verdict(
        "RDMA GIDs",
        node,
        CRITICAL,
        "; ".join(bad) or "GID check failed",
        "`ansible-playbook playbooks/provision.yml` (roce_network puts the address and GID 3 back)",
    )


def check_containers(node: str, containers: list[dict]) -> list[dict]:
    """Bounded recovery: a crashed container is named with how often it restarted and its last log lines."""
    out = []
    for c in containers:
        name = c["name"]
        st = c.get("status")
        if st == "running" and not c.get("restarting"):
            ev = f"{name} running" + (
                f", restarted {c['restart_count']} times by Docker" if c.get("restart_count") else ""
            )
            out.append(verdict(f"container {name}", node, WARN if c.get("restart_count") else PASS, ev))
            continue
        tail = " | ".join((c.get("log_tail") or [])[-3:])
        out.append(
            verdict(
                f"container {name}",
                node,
                CRITICAL,
                f"{name} {st or 'missing'} (exit code {c.get('exit_code')}"
                + (f", restarted {c['restart_count']} times by Docker" if c.get("restart_count") else "")
                + (", OOM-killed" if c.get("oom_killed") else "")
                + f", finished {c.get('finished_at') or '?'}); last log: {tail or 'none'}",
                f"read `docker logs --tail 50 {name}` on {node}, fix the cause, then `ansible-playbook site.yml`",
            )
        )
    return out


# --------------------------------------------------------------------------- cluster checks
def check_cables(cables: dict | None, hardware: str, threshold: float) -> dict:
    if hardware != "dgx_spark":
        return verdict("per-cable bandwidth", "cluster", NA, "not applicable: no RDMA device in the simulated cluster")
    if not cables:
        return verdict(
            "per-cable bandwidth",
            "cluster",
            WARN,
            "no ib_write_bw report yet",
            "ansible-playbook playbooks/provision.yml (measures every cable)",
        )
    bad = {k: v for k, v in cables.items() if v.get("verdict") != "healthy"}
    ev = "; ".join(f"{k}: {v.get('total_gbps', '?')} Gb/s ({v.get('verdict')})" for k, v in cables.items())
    if bad:
        return verdict(
            "per-cable bandwidth",
            "cluster",
            CRITICAL,
            ev + f"; healthy threshold {threshold:g} Gb/s",
            "reboot both ends of " + ", ".join(bad) + "; if still low, reseat or replace that QSFP cable",
        )
    return verdict("per-cable bandwidth", "cluster", PASS, ev + f"; threshold {threshold:g} Gb/s")


def check_cabling(discovery: dict | None, reads: dict) -> dict:
    """The cables found now (each node's fabric_discover read) against the inventory's links.

    discovery: {hosts, head, topology, links: {host: the model's links}, hardware}; reads: host -> read.
    """
    name = "cabling as in the inventory"
    if not discovery:
        return verdict(name, "cluster", NA, "not applicable: the cabling was not read")
    hosts = list(discovery.get("hosts") or [])
    got = {h: r for h, r in (reads or {}).items() if isinstance(r, dict) and r.get("ports") is not None}
    heard = any(p.get("neighbours") for r in got.values() for p in r.get("ports") or [])
    if not heard:
        return verdict(
            name,
            "cluster",
            NA,
            "not applicable: no port heard a neighbour (no lldpd on the nodes and no IPv6 link-local neighbours)",
            "apt-get install lldpd on every node to let doctor check the cables",
        )
    if discovery.get("all_at_once") is False:
        return verdict(
            name,
            "cluster",
            NA,
            f"not applicable: fewer forks than the {len(hosts)} nodes, so they were not read at the same time",
            f"rerun doctor with -f {len(hosts)} to check the cabling",
        )
    missing = [h for h in hosts if h not in got]
    if missing:
        return verdict(name, "cluster", WARN, f"the ports of {', '.join(missing)} could not be read", "")
    settings = {"head": discovery.get("head"), "allow_any_port": True}
    if discovery.get("hardware") != "dgx_spark":
        settings["speed_mbps"] = 0
    try:
        result = infer(got, hosts, settings)
    except DiscoveryError as err:
        return verdict(
            name,
            "cluster",
            CRITICAL,
            "; ".join(err.problems),
            "move or check the cable named; ansible-playbook playbooks/discover.yml -i <hosts> shows the whole cabling",
        )
    moved = moved_cables(discovery.get("links") or {}, result)
    want = discovery.get("topology")
    if want and want != result["topology"]:
        moved.insert(0, f"the inventory says {want}, the cables make a {result['topology']}")
    if moved:
        return verdict(
            name,
            "cluster",
            CRITICAL,
            "; ".join(moved),
            "put the cables back as the inventory says, or write a new inventory with playbooks/discover.yml",
        )
    n = len(result["cables"]) or len(result["segments"])
    what = f"{n} cable(s)" if result["cables"] else "the switch"
    return verdict(name, "cluster", PASS, f"{result['topology']}: {what} where the inventory says")


def check_nccl(results: dict, hardware: str) -> dict:
    """results: node -> nccl_transport result (or None where no log)."""
    if hardware != "dgx_spark":
        return verdict("NCCL transport", "cluster", NA, "not applicable: the vLLM test double runs no NCCL")
    seen = {n: r for n, r in results.items() if r}
    if not seen:
        return verdict(
            "NCCL transport",
            "cluster",
            WARN,
            "no NCCL INFO log found",
            "ansible-playbook playbooks/verify.yml (runs the fast-path proof)",
        )
    bad = {n: r for n, r in seen.items() if not r.get("ok")}
    ev = "; ".join(f"{n}: {r.get('message')}" for n, r in seen.items())
    if bad:
        return verdict(
            "NCCL transport",
            "cluster",
            CRITICAL,
            ev,
            "check NCCL_IB_HCA and /dev/infiniband in the containers (playbooks/verify.yml)",
        )
    return verdict("NCCL transport", "cluster", PASS, ev)


def check_nccl_busbw(report: dict | None, hardware: str) -> dict:
    """report: the last NCCL gate's verdict (verify.yml writes reports/nccl_busbw.json)."""
    name = "NCCL bus bandwidth"
    if hardware != "dgx_spark":
        return verdict(name, "cluster", NA, "not applicable: the stand-in image has no torch or NCCL, and no GPU")
    if not report or report.get("verdict") not in ("PASS", "FAIL"):
        return verdict(
            name, "cluster", WARN, "no all_gather probe result yet", "ansible-playbook playbooks/verify.yml (runs it)"
        )
    ev = f"{report.get('message')} ({report.get('nodes', '?')} nodes, measured {report.get('measured', '?')})"
    if report["verdict"] == "FAIL":
        return verdict(
            name,
            "cluster",
            CRITICAL,
            ev,
            "read NCCL's INFO log for NET/Socket, check NCCL_IB_HCA names both twins and the cables "
            "(playbooks/provision.yml measures them); then playbooks/verify.yml",
        )
    return verdict(name, "cluster", PASS, ev)


def check_ray(
    ray: dict, expected_nodes: int, expected_gpus: float, scope: str = "cluster", head: str = "the head"
) -> dict:
    """One Ray cluster's membership verdict; `scope` names the Ray group when the plan runs several, `head`
    the node its GCS runs on."""
    if ray and ray.get("not_used"):
        # The serving plan runs no Ray (vLLM's own multi-node executor): the containers' checks cover the ranks.
        return verdict("Ray membership", scope, NA, f"not applicable: {ray['not_used']}")
    if not ray or ray.get("failed") or ray.get("error") or ray.get("unreachable"):
        return verdict(
            "Ray membership",
            scope,
            CRITICAL,
            f"Ray could not be read: {(ray or {}).get('msg') or (ray or {}).get('error') or 'no answer'}",
            f"docker logs sparkops-ray on {head}; `ansible-playbook site.yml` restarts the group",
        )
    # Keys of sparkops.cluster.ray_cluster_status (the one source for alive nodes and GPUs).
    alive, gpus = int(ray.get("nodes_alive", 0)), float(ray.get("gpus_total", 0) or 0)
    ev = f"{alive} of {expected_nodes} nodes alive, {gpus:g} of {expected_gpus:g} GPUs"
    if ray.get("dead_node_ips"):
        ev += f"; dead: {', '.join(ray['dead_node_ips'])}"
    if alive < expected_nodes or gpus < expected_gpus:
        return verdict(
            "Ray membership",
            scope,
            CRITICAL,
            ev,
            "bring the missing node back (power, cable, `docker ps` on it); "
            "the watchdog restarts the group once it answers",
        )
    return verdict("Ray membership", scope, PASS, ev)


def check_rays(ray, expected_nodes: int, expected_gpus: float) -> list[dict]:
    """One Ray membership verdict per Ray group. `ray`: a looped ray_cluster_status's results over the serving
    plan's ray_groups (each with its group as `item`, judged against the group's own expected nodes and GPUs:
    with one group scope "cluster", as before groups; with several "<name> (<hosts>)"), or one reading (or
    {'not_used': why}) judged against `expected_nodes`/`expected_gpus`."""
    if not isinstance(ray, list):
        return [check_ray(ray or {}, expected_nodes, expected_gpus)]
    several = len(ray) > 1
    out = []
    for reading in ray:
        group = reading.get(reading.get("ansible_loop_var") or "item") or {}
        scope = f"{group.get('name')} ({', '.join(group.get('hosts') or [])})" if several else "cluster"
        out.append(
            check_ray(
                reading,
                int(group.get("expected_nodes", expected_nodes)),
                float(group.get("expected_gpus", expected_gpus)),
                scope,
                str(group.get("head") or "the head"),
            )
        )
    return out


def check_endpoint(health: dict, scope: str = "cluster") -> dict:
    """The endpoint's verdict; `scope` names the replica when the cluster serves several (else "cluster")."""
    if health.get("healthy"):
        return verdict("endpoint", scope, PASS, f"completion answered, first token in {health.get('ttft_s')} s")
    failed = {k: v for k, v in (health.get("checks") or {}).items() if not v.get("ok")}
    ev = (
        "; ".join(f"{k}: {v.get('message') or v.get('kind')}" for k, v in failed.items())
        or health.get("msg")
        or "no completion"
    )
    kind = health.get("failure_kind")
    if kind == "engine_dead":
        # vLLM 0.19.0 answers 503 only for EngineDeadError: the engine does not come back, the server exits (status 0).
        action = (
            "vLLM's engine is dead and its API server is exiting (status 0, so restart policy on-failure does not "
            "restart it): the first error in the vLLM container's `docker logs` is the cause; the watchdog "
            "restarts the group, or `ansible-playbook site.yml` does"
        )
    elif kind == "refused":
        action = (
            "nothing listens: vLLM is not running, or is still starting (it listens only once its engine is up); "
            "see the watchdog and container verdicts below; `ansible-playbook site.yml` restarts serving"
        )
    else:
        action = "see the watchdog and container verdicts below; `ansible-playbook site.yml` restarts serving"
    return verdict("endpoint", scope, CRITICAL, f"[{kind}] {ev}" if kind else ev, action)


def replica_scope(item: dict, several: bool) -> str:
    """A per-replica verdict's scope: "cluster" with one replica, else "<deployment> replica <index> (<url>)"."""
    return f"{item.get('name')} ({item.get('url')})" if several else "cluster"


def check_endpoints(endpoints: list) -> list[dict]:
    """One endpoint verdict per replica, from a looped timed completion's results (each with its serving
    target as `item`): with one replica today's one verdict (scope cluster), with several each's scope
    "<deployment> replica <index> (<url>)"."""
    several = len(endpoints) > 1
    return [check_endpoint(health, replica_scope(health.get("item") or {}, several)) for health in endpoints]


def check_quality(results: list) -> list[dict]:
    """Whether each replica answers RIGHT, not only whether it answers: vllm_quality's result per replica (the
    reference passage's mean log-likelihood and the known answers, judged against the recorded baseline where
    one is given, else against the floor alone). A wrong engine answers 200 OK: CRITICAL with the figures.
    A replica that could not be asked is the endpoint verdict's business: N/A here, saying why."""
    several = len(results) > 1
    out = []
    for r in results:
        scope = replica_scope(r.get("item") or {}, several)
        figures = r.get("figures") or {}
        verdict_ = r.get("verdict") or {}
        # Judged only with vllm_quality's verdict (wrong_answers always has one): a probe that failed, however
        # (a failure_kind, or a module that crashed with none), was not asked.
        if r.get("unreachable") or not verdict_:
            why = r.get("msg") or r.get("failure_kind") or "not asked"
            out.append(verdict("answer quality", scope, NA, f"not judged: {str(why)[:200]}"))
            continue
        answers = figures.get("known_answers") or {}
        right = sum(1 for a in answers.values() if (a or {}).get("ok"))
        ev = (
            f"reference passage: mean log-likelihood {figures.get('mean_logprob')} nats/token "
            f"(perplexity {figures.get('perplexity')}, {figures.get('prompt_tokens')} tokens); "
            f"known answers right: {right}/{len(answers)}"
        )
        if verdict_.get("compared"):
            ev += (
                f"; {verdict_.get('delta_mean_logprob')} nats from the baseline (tolerance {verdict_.get('tolerance')})"
            )
        if verdict_.get("ok"):
            out.append(verdict("answer quality", scope, PASS, ev))
            continue
        reasons = "; ".join(str(x) for x in (verdict_.get("reasons") or []))[:400]
        out.append(
            verdict(
                "answer quality",
                scope,
                CRITICAL,
                f"{ev}; {reasons}" if reasons else ev,
                "the engine answers, but wrongly: check the image (a kernel that regressed in a new build), the "
                "weights (`ansible-playbook playbooks/weights.yml` compares them with the source) and the profile's "
                "quantization; after an upgrade, upgrade back to the previous ref or profile (deployment.json on the "
                "head records it)",
            )
        )
    return out


# A request without the key that gets one of these was refused by authentication; any other HTTP answer
# (2xx, but also 400, 404, 405, 5xx) means the key was not asked before the route was reached.
_KEY_ASKED = (401, 403)


def keyless_answers(probes: dict) -> list[str]:
    """The probes without the key that got an HTTP answer other than 401/403, as 'origin POST url -> status'.

    probes: {origin: [uri results]}, each result with `url` (or the loop's `item`) and `status`: the HTTP
    status, or -1/None for no answer (refused, dropped by the firewall, timed out), which is as good as
    being asked for the key.
    """
    out = []
    for origin, results in (probes or {}).items():
        for r in results or []:
            try:
                status = int(r.get("status"))
            except (TypeError, ValueError):
                continue
            if status > 0 and status not in _KEY_ASKED:
                out.append(f"{origin} POST {r.get('url') or r.get('item') or '?'} -> {status}")
    return out


def keyless_probe_urls(cluster: dict) -> list[str]:
    """What doctor POSTs without the key (/invocations, /tokenize): at the head's management address and its
    endpoint, then at every replica's API node's management address and its API URL (each once). With the
    default deployment that is the head's two, as before deployments."""
    bases = []
    places = [(cluster["head"], cluster["endpoint"]["port"], cluster["endpoint"]["url"])]
    places += [(t["host"], t["port"], t["url"]) for t in cluster["serving"]["targets"]]
    for host, port, url in places:
        mgmt = cluster["nodes"][host]["mgmt_address"]
        bases += [f"http://{f'[{mgmt}]' if ':' in mgmt else mgmt}:{port}", url]
    return [base + path for base in dict.fromkeys(bases) for path in ("/invocations", "/tokenize")]


def check_exposure(probe: dict, serve_host: str, mgmt_address: str) -> dict:
    """probe: {mgmt_reachable: bool, unauth_status: int|None} as the controller saw them, and unauth_probes:
    POST /invocations and /tokenize without the key at the management and the fast-link address (keyless_answers).
    vLLM 0.19.0 asks its --api-key only under /v1, so /v1/models alone proves nothing about the other paths."""
    status = probe.get("unauth_status")
    reach = probe.get("mgmt_reachable")
    keyless = keyless_answers(probe.get("unauth_probes") or {})
    ev = (
        f"port {'reachable' if reach else 'closed'} on the management address {mgmt_address}; "
        f"a request without the key gets {status if status is not None else 'no answer'}"
    )
    if keyless:
        return verdict(
            "API exposure",
            "cluster",
            CRITICAL,
            ev + "; served without the key: " + ", ".join(keyless),
            "run serve.yml (vllm_serve's --middleware asks the key on every path) and site.yml "
            "(the firewall keeps the port to the fast links and sparkops_client_networks)",
        )
    if status is not None and 200 <= int(status) < 300:
        return verdict(
            "API exposure",
            "cluster",
            CRITICAL,
            ev + " (no key required)",
            "run serve.yml: vllm_serve writes the key file and starts vLLM with the middleware that asks it",
        )
    if reach and serve_host not in ("0.0.0.0", mgmt_address):  # noqa: S104 - a setting compared, nothing bound
        return verdict(
            "API exposure",
            "cluster",
            WARN,
            ev + f" though vllm_serve_host is {serve_host}",
            "check for a port forward or proxy on the head",
        )
    return verdict("API exposure", "cluster", PASS, ev + (" (as configured)" if reach else ""))


def watchdog_stopped(state: dict | None) -> str | None:
    """Why the watchdog stopped restarting and when it tries next (None while it has not stopped).

    The state is roles/watchdog's watchdog-state.json: status "gave_up" once the hour's restarts are spent,
    with gave_up_reason, restarts_in_hour, retries_after_budget and next_retry_at (sparkops_watchdog.py).
    """
    if not isinstance(state, dict) or state.get("status") != "gave_up":
        return None
    why = state.get("gave_up_reason") or state.get("reason") or "unknown"
    limit = ((state.get("config") or {}).get("max_restarts_per_hour")) or "?"
    done = state.get("restarts_in_hour")
    line = f"the watchdog stopped restarting: {why}"
    line += f" (restarted {done} times in the last hour, max_restarts_per_hour={limit})" if done is not None else ""
    tries = int(state.get("retries_after_budget") or 0)
    if state.get("next_retry_at"):
        line += f"; next try at {state['next_retry_at']}" + (f" ({tries} tries since)" if tries else "")
    else:
        line += "; no further try scheduled: it waits for a completion to answer"
    return line


def check_watchdog(state: dict | None, events: list[dict], running: bool, now_epoch: float) -> dict:
    if not state:
        return verdict(
            "watchdog",
            "cluster",
            CRITICAL,
            "no watchdog state on the head: not installed or never started",
            "ansible-playbook site.yml (installs roles/watchdog)",
        )
    restarts = [e for e in events if e.get("event") == "restart_begun" and now_epoch - float(e.get("epoch", 0)) < 3600]
    last = [
        e
        for e in events
        if e.get("event") in ("gave_up", "blocked", "restart_ended", "hang_seen", "worker_lost", "floor_crossed")
    ][-3:]
    ev = f"status {state.get('status')}: {state.get('reason')}; {len(restarts)} group restart(s) in the last hour"
    if last:
        ev += "; recent: " + " | ".join(f"{e.get('ts')} {e.get('event')}: {e.get('message')}" for e in last)
    if not running:
        return verdict(
            "watchdog",
            "cluster",
            CRITICAL,
            "watchdog container not running; " + ev,
            "docker logs sparkops-watchdog on the head; `ansible-playbook site.yml`",
        )
    st = state.get("status")
    stopped = watchdog_stopped(state)
    if stopped:
        return verdict(
            "watchdog",
            "cluster",
            CRITICAL,
            stopped + "; " + ev,
            "fix what the reason names (a crash at start, a node that loses its Ray worker, the memory floor), "
            "then `ansible-playbook site.yml`; the watchdog watches again on the first good completion",
        )
    if st in ("gave_up", "blocked"):
        return verdict(
            "watchdog",
            "cluster",
            CRITICAL,
            ev,
            "fix what the reason names (a node down, a crash at start, the memory floor), "
            "then `ansible-playbook site.yml`; "
            "the watchdog resumes on the first good completion",
        )
    if st in ("degraded", "restarting") or restarts:
        return verdict("watchdog", "cluster", WARN, ev, "read /var/lib/sparkops/watchdog.jsonl on the head")
    return verdict("watchdog", "cluster", PASS, ev)


def render_markdown(cluster: str, verdicts: list[dict], generated: str) -> str:
    lines = [
        f"# sparkops doctor: {cluster}",
        "",
        f"Overall: **{overall(verdicts)}** ({generated})",
        "",
        "| verdict | check | where | evidence | next action |",
        "|---|---|---|---|---|",
    ]
    for v in sorted(verdicts, key=lambda v: -_RANK[v["verdict"]]):
        cells = [v["verdict"], v["check"], v["scope"], v["evidence"], v["action"] or ""]
        lines.append("| " + " | ".join(re.sub(r"\s+", " ", str(c)).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def check_allowed_rules(lines: list[str]) -> dict:
    """The SM121 hard rules sparkops_allow_rules lets through (lines from serving_profile's
    allowed_rule_warnings): WARN with each rule and its reason, so nobody forgets one is off."""
    if not lines:
        return verdict(
            "SM121 rules", "cluster", PASS, "every SM121 hard rule is enforced (sparkops_allow_rules is empty)"
        )
    return verdict(
        "SM121 rules",
        "cluster",
        WARN,
        " | ".join(str(line) for line in lines),
        "keep the entry only while its reason holds on the image you run; remove it from sparkops_allow_rules "
        "once the profile no longer needs it",
    )


FAMILY_NAME = {"ipv4": "IPv4", "ipv6": "IPv6"}


def check_firewall(node: str, fw: dict | None) -> dict:
    """Every SPARKOPS chain the node's rules files name (iptables_chain and roce_network write them), per family:
    the chain exists, something (INPUT, or FORWARD for the ring's chain) jumps to it, and it ends in DROP.
    A missing one is CRITICAL: the ports it guards answer the management LAN (or IPv6) until it is back."""
    fw = fw or {}
    expected = fw.get("expected") or []
    if not expected:
        return verdict(
            "firewall",
            node,
            NA,
            "no SPARKOPS rules files on this node (site.yml writes one per chain and family)",
            "run site.yml if this node serves anything",
        )
    problems = []
    for e in expected:
        chain, family = e.get("chain"), e.get("family")
        read = fw.get(family) or {"error": "not read"}
        name = f"{chain} ({FAMILY_NAME.get(family, family)})"
        if read.get("error"):
            problems.append(f"{name}: the firewall could not be read ({read['error']})")
        elif chain not in read.get("chains", []):
            problems.append(f"{name} is missing")
        elif not (read.get("hooks") or {}).get(chain):
            problems.append(f"{name}: nothing jumps to it from INPUT or FORWARD")
        elif not (read.get("drops") or {}).get(chain):
            problems.append(f"{name} does not end in DROP")
    chains = sorted({e.get("chain") for e in expected})
    if problems:
        return verdict(
            "firewall",
            node,
            CRITICAL,
            "; ".join(problems),
            "restore them now (`systemctl start sparkops-firewall`, or `/etc/init.d/sparkops-firewall start` without "
            "systemd) or run site.yml again; until then the ports they guard answer the management LAN",
        )
    return verdict(
        "firewall", node, PASS, f"{', '.join(chains)} in place for IPv4 and IPv6, each with its jump, DROP last"
    )


def _port_in(port: int, specs) -> bool:
    for spec in specs or []:
        low, _sep, high = str(spec).partition(":")
        if low.isdigit() and (high or low).isdigit() and int(low) <= port <= int(high or low):
            return True
    return False


def check_listening(node: str, sockets: list[dict] | None, fw: dict | None, allowed, error: str = "") -> dict:
    """Every TCP socket on the any address (`*`: IPv4 and IPv6; `0.0.0.0`: IPv4; `[::]`: IPv6 only) must be
    one the plan expects: a port a SPARKOPS chain guards in each family the socket answers, or one of
    `allowed` (sshd's 22 and what the settings add). Any other is CRITICAL: it answers every network."""
    if sockets is None:
        return verdict(
            "listening sockets", node, WARN, f"could not list them: {error or 'not read'}", "install iproute2"
        )
    fw = fw or {}
    guarded = {
        fam: [p for chain, ports in ((fw.get(fam) or {}).get("ports") or {}).items() if chain.startswith("SPARKOPS-")
              for p in ports]
        for fam in ("ipv4", "ipv6")
    }  # fmt: skip
    families = {"*": ("ipv4", "ipv6"), "0.0.0.0": ("ipv4",), "[::]": ("ipv6",)}  # noqa: S104 - ss's any addresses
    bad, ok = [], 0
    for sock in sockets:
        if not sock.get("wildcard"):
            continue
        port = int(sock["port"])
        open_in = [f for f in families.get(sock["address"], ("ipv4", "ipv6")) if not _port_in(port, guarded[f])]
        if not open_in or _port_in(port, allowed):
            ok += 1
            continue
        who = f" ({sock['process']})" if sock.get("process") else ""
        bad.append(f"{sock['address']}:{port}{who} unguarded for {'/'.join(FAMILY_NAME[f] for f in open_in)}")
    if bad:
        return verdict(
            "listening sockets",
            node,
            CRITICAL,
            f"on the any address, no SPARKOPS chain guards and the plan does not expect: {'; '.join(sorted(set(bad)))}",
            "bind the service to a fast-link address or loopback, or stop it; a port the plan runs belongs in its "
            "chain (a port you run on purpose goes into sparkops_doctor_listen_allowed)",
        )
    return verdict(
        "listening sockets", node, PASS, f"{ok} sockets on the any address, each guarded by a chain or expected"
    )


def build_verdicts(inputs: dict) -> list[dict]:
    """Every check from what doctor.yml gathered (keys documented in playbooks/doctor.yml)."""
    s = inputs["settings"]
    hw = s["hardware"]
    out: list[dict] = []
    for node, f in sorted(inputs["nodes"].items()):
        if not f:
            out.append(
                verdict(
                    "node reachable",
                    node,
                    CRITICAL,
                    "Ansible could not reach this node; nothing on it could be read",
                    f"check the node's power and management link; `ssh {node}`",
                )
            )
            continue
        out.append(check_driver(node, f.get("gpu") or {}, s["driver_branch"]))
        out.append(check_kernel(node, f.get("kernel", ""), s.get("kernel_known_bad", [])))
        out.append(
            check_nic(
                node, f.get("nic_functions", []), hw, int(s.get("nic_pcie_width", 4)), s.get("nic_firmware_min", "")
            )
        )
        out.append(check_gpu_clocks(node, f.get("gpu_clocks"), (f.get("gpu") or {}).get("reason") or ""))
        out.append(check_memory(node, f.get("available_bytes"), float(s["memory_floor_gib"]), f.get("floor_marker")))
        out.append(check_disk(node, f.get("disk_free_bytes"), float(s["disk_headroom_gib"]), s["weights_path"]))
        out.append(check_gids(node, f.get("rdma") or {}))
        out.extend(check_containers(node, f.get("containers", [])))
        if "firewall" in f:  # node_doctor_facts reads it (older results have none)
            out.append(check_firewall(node, f.get("firewall")))
            out.append(
                check_listening(
                    node,
                    f.get("listening"),
                    f.get("firewall"),
                    s.get("listen_allowed", ["22"]),
                    f.get("listening_error", ""),
                )
            )
    out.append(check_cables(inputs.get("cables"), hw, float(s["cable_threshold_gbps"])))
    if inputs.get("discovery"):
        reads = {n: (f or {}).get("discover") for n, f in inputs["nodes"].items()}
        out.append(check_cabling(dict(inputs["discovery"], hardware=hw), reads))
    out.append(check_nccl(inputs.get("nccl") or {}, hw))
    out.append(check_nccl_busbw(inputs.get("nccl_busbw"), hw))
    # One verdict per Ray group (doctor.yml reads each on its own head), or the one reading given.
    out.extend(check_rays(inputs.get("ray") or {}, int(s["expected_nodes"]), float(s["expected_gpus"])))
    # Every replica's completion when doctor.yml gives them (`endpoints`), else the one `health`.
    out.extend(check_endpoints(inputs.get("endpoints") or [inputs.get("health") or {}]))
    out.extend(check_quality(inputs.get("quality") or []))
    out.append(check_exposure(inputs.get("exposure") or {}, s["serve_host"], s["mgmt_address"]))
    out.append(check_allowed_rules(inputs.get("allowed_rules") or []))
    out.append(
        check_watchdog(
            inputs.get("watchdog_state"),
            inputs.get("watchdog_events") or [],
            bool(inputs.get("watchdog_running")),
            float(inputs["now_epoch"]),
        )
    )
    return out
