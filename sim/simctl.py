#!/usr/bin/env python3
"""simctl: the sparkops simulated two-Spark cluster on one machine.

Two containers, spark-sim-1 (head) and spark-sim-2, that look to Ansible like two
DGX Sparks as far as a machine without GPU or RDMA allows:

* a Debian bookworm root file system made with debootstrap and `docker import`
  (no registry needed), cached by a hash of what goes into it;
* their own sshd (Ansible connects over SSH with a key made per cluster) and
  their own dockerd (Docker-in-Docker with explicit capabilities, since
  --privileged is refused on these machines);
* a management LAN (interface enP7s7) and two point-to-point "QSFP" networks
  with MTU 9000 (interfaces enp1s0f1np1 and enP2p1s0f1np1: the two twins of a
  ConnectX-7 port, on different subnets as on real Sparks). All three networks
  are --internal: the nodes have no route out;
* a local apt repository of dummy NVIDIA packages (580.x and 590.x), Ray and
  huggingface_hub wheels, a local git repository standing in for
  eugr/spark-vllm-docker, and a Hub-speaking server on the management bridge
  that serves a small stand-in model (the head downloads it as from the Hub).

Commands: ensure-host, build, up, down, status, limit-memory, hosts-only, inventory, and on a ring the
cabling faults unplug, cross, replug. State lives in .sim/.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIM = ROOT / "sim"
STATE = Path(os.environ.get("SPARKOPS_SIM_STATE", ROOT / ".sim"))
PREFIX = "sparkops-sim"
SUITE = "bookworm"
MIRROR = os.environ.get("SPARKOPS_SIM_MIRROR", "http://deb.debian.org/debian")
RAY_VERSION = os.environ.get("SPARKOPS_SIM_RAY_VERSION", "2.52.1")
# The Hub client eugr's image carries (pip's resolution at the pinned build: docs/simulation.md); the
# stand-in image installs it from the test bed's wheels, so the download runs the same client code.
HF_HUB_VERSION = "0.36.2"

NETWORKS = {
    # name: (subnet, mtu)
    f"{PREFIX}-mgmt": ("192.168.213.0/24", 1500),
    f"{PREFIX}-qsfp0": ("10.213.0.0/24", 9000),
    f"{PREFIX}-qsfp1": ("10.213.1.0/24", 9000),
}
NODES = [
    {
        "name": "spark-sim-1",
        "mgmt": "192.168.213.11",
        "fast": [
            ("10.213.0.11", "enp1s0f1np1", f"{PREFIX}-qsfp0"),
            ("10.213.1.11", "enP2p1s0f1np1", f"{PREFIX}-qsfp1"),
        ],
    },
    {
        "name": "spark-sim-2",
        "mgmt": "192.168.213.12",
        "fast": [
            ("10.213.0.12", "enp1s0f1np1", f"{PREFIX}-qsfp0"),
            ("10.213.1.12", "enP2p1s0f1np1", f"{PREFIX}-qsfp1"),
        ],
    },
]
MGMT_IFACE = "enP7s7"
# A real image registry for the pull-by-digest path (spark_vllm_image_source: registry): Debian's
# docker-registry (CNCF distribution) on this machine, the "control host", bound only to its address
# on the management bridge. The nodes' dockerd get it as an insecure registry (no TLS on the sim's
# internal, no-route-out network).
REGISTRY_HOST = NETWORKS[f"{PREFIX}-mgmt"][0].rsplit(".", 1)[0] + ".1"
REGISTRY_ADDR = f"{REGISTRY_HOST}:5000"

# ------------------------------------------------------------------------ topology
# The default is the two-node pair above (inventory/sim describes it). `up --nodes N --topology T`
# makes a switch (every node on the two QSFP networks above) or a ring (one pair of networks per
# cable, node i's port 0 twins to node i+1's port 1 twins, 10.214.<2*cable+twin>.0/24, node i at
# .<11+i>) and writes an inventory for it under .sim/inventories/<topology>-<N>/.
TOPOLOGIES = ("pair", "switch", "ring")
PORT0 = ("enp1s0f0np0", "enP2p1s0f0np0")
PORT1 = ("enp1s0f1np1", "enP2p1s0f1np1")
# A ring node forwards for its neighbours; replies may come back the other way round.
RING_SYSCTLS = {"net.ipv4.ip_forward": "1", "net.ipv4.conf.all.rp_filter": "2"}


def configure(n: int, topology: str) -> None:
    """Set NODES and NETWORKS for n nodes in the given topology (pair: the defaults above)."""
    global NODES, NETWORKS  # noqa: PLW0603 - one configuration per simctl run
    if topology not in TOPOLOGIES:
        sys.exit(f"simctl: topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    if topology == "pair" and n != 2:
        sys.exit(f"simctl: a pair is two nodes, not {n}; use --topology switch or ring")
    if topology == "ring" and n < 3:
        sys.exit("simctl: a ring needs three or more nodes")
    if not 2 <= n <= 8:
        sys.exit("simctl: 2 to 8 nodes")
    if topology == "pair" or (topology == "switch" and n == 2):
        return
    names = [f"spark-sim-{i + 1}" for i in range(n)]
    nets = {f"{PREFIX}-mgmt": NETWORKS[f"{PREFIX}-mgmt"]}
    fast = {name: [] for name in names}
    if topology == "switch":
        for t, ifname in enumerate(PORT1):
            nets[f"{PREFIX}-qsfp{t}"] = (f"10.213.{t}.0/24", 9000)
            for i, name in enumerate(names):
                fast[name].append((f"10.213.{t}.{11 + i}", ifname, f"{PREFIX}-qsfp{t}"))
    else:
        for c in range(n):
            a, b = c, (c + 1) % n
            for t in range(2):
                net = f"{PREFIX}-ring-c{c}t{t}"
                nets[net] = (f"10.214.{2 * c + t}.0/24", 9000)
                fast[names[a]].append((f"10.214.{2 * c + t}.{11 + a}", PORT0[t], net))
                fast[names[b]].append((f"10.214.{2 * c + t}.{11 + b}", PORT1[t], net))
    NETWORKS = nets
    NODES = []
    for i, name in enumerate(names):
        node = {"name": name, "mgmt": f"192.168.213.{11 + i}", "fast": fast[name]}
        if topology == "ring":
            node["sysctls"] = RING_SYSCTLS
        NODES.append(node)


def inventory_dir(n: int, topology: str) -> Path:
    if topology == "pair" or (topology == "switch" and n == 2):
        return ROOT / "inventory" / "sim"
    return STATE / "inventories" / f"{topology}-{n}"


def write_topology_inventory(n: int, topology: str) -> Path:
    """An inventory for the current NODES: inventory/sim's settings plus the topology."""
    inv = inventory_dir(n, topology)
    if inv == ROOT / "inventory" / "sim":
        return inv
    gv = inv / "group_vars" / "all"
    gv.mkdir(parents=True, exist_ok=True)
    for src in sorted((ROOT / "inventory" / "sim" / "group_vars" / "all").glob("*.yml")):
        shutil.copy2(src, gv / src.name)
    hosts = {}
    for node in NODES:
        links = [
            {
                "netdev": ifname,
                "rdma_device": "roce" + ifname.replace("en", "", 1).rsplit("np", 1)[0],
                "address": f"{a}/24",
            }
            for a, ifname, _net in node["fast"]
        ]
        hosts[node["name"]] = {"ansible_host": node["mgmt"], "sparkops_fast_links": links}
    head = NODES[0]["name"]
    data = {
        "all": {
            "children": {
                "spark_cluster": {
                    "children": {
                        "spark_head": {"hosts": {head: hosts[head]}},
                        "spark_workers": {"hosts": {h: v for h, v in hosts.items() if h != head}},
                    }
                }
            }
        }
    }
    header = f"# Made by sim/simctl.py up --nodes {n} --topology {topology}; do not edit.\n"
    (inv / "hosts.yml").write_text(header + json.dumps(data, indent=2) + "\n")
    # Another cluster than the pair: its own lock and reports (the pair's lock pins the pair's
    # deployment and would refuse this one's profile); the API key stays the sim's one.
    (gv / "topology.yml").write_text(
        header
        + f"sparkops_topology: {topology}\n"
        + f"sparkops_sim_state_dir: {json.dumps(str(STATE.resolve()))}\n"
        + 'sparkops_lock_file: "{{ inventory_dir }}/sparkops.lock.json"\n'
        + 'sparkops_reports_dir: "{{ inventory_dir }}/reports"\n'
    )
    return inv


def write_hosts_only_inventory(n: int, topology: str) -> Path:
    """An inventory naming only the hosts and how to reach them (no fast links, no topology): the input
    of playbooks/discover.yml on this test bed. Its group_vars (inventory/sim's, with this cluster's own
    lock and reports when it is not the pair) go next to the inventory discover.yml writes."""
    inv = STATE / "inventories" / f"{topology}-{n}-hosts-only"
    gv = inv / "group_vars" / "all"
    gv.mkdir(parents=True, exist_ok=True)
    for src in sorted((ROOT / "inventory" / "sim" / "group_vars" / "all").glob("*.yml")):
        shutil.copy2(src, gv / src.name)
    header = f"# Made by sim/simctl.py hosts-only --nodes {n} --topology {topology}; do not edit.\n"
    if inventory_dir(n, topology) != ROOT / "inventory" / "sim":
        (gv / "topology.yml").write_text(
            header
            + f"sparkops_sim_state_dir: {json.dumps(str(STATE.resolve()))}\n"
            + 'sparkops_lock_file: "{{ inventory_dir }}/sparkops.lock.json"\n'
            + 'sparkops_reports_dir: "{{ inventory_dir }}/reports"\n'
        )
    head = NODES[0]["name"]
    workers = {node["name"]: {"ansible_host": node["mgmt"]} for node in NODES[1:]}
    data = {
        "all": {
            "children": {
                "spark_cluster": {
                    "children": {
                        "spark_head": {"hosts": {head: {"ansible_host": NODES[0]["mgmt"]}}},
                        "spark_workers": {"hosts": workers},
                    }
                }
            }
        }
    }
    (inv / "hosts.yml").write_text(header + json.dumps(data, indent=2) + "\n")
    return inv


# What the node root file system holds. The nodes have no route out, so all
# the deployment needs on a node is baked in here.
NODE_PACKAGES = [
    "python3",
    "python3-apt",
    "python3-docker",
    "python3-requests",
    "openssh-server",
    "openssh-client",
    "rsync",
    "git",
    "docker.io",
    "iproute2",
    "iputils-ping",
    "sudo",
    "iptables",
    "procps",
    "zstd",
    "ca-certificates",
    "netcat-openbsd",
    "less",
    "tini",
    "kmod",
    # The monitoring role's daemons (the nodes have no route out to install them).
    "prometheus",
    "prometheus-node-exporter",
    # playbooks/discover.yml reads the cabling by LLDP: the real daemon, started by fabric_discover for
    # the discovery only (no init system here starts it).
    "lldpd",
    # The client gateway's key database and venv (roles/gateway installs them with apt on a real head).
    "postgresql",
    "python3-venv",
]
# The base of the stand-in serving image, loaded into each node's dockerd.
VLLM_BASE_PACKAGES = ["python3", "python3-pip", "procps", "iproute2", "ca-certificates"]

# Docker-in-Docker without --privileged (refused here: no CAP_SYS_RESOURCE).
CAPS = ["SYS_ADMIN", "NET_ADMIN", "NET_RAW", "SYS_PTRACE", "MKNOD", "SYS_CHROOT", "SETFCAP", "AUDIT_WRITE"]


def log(msg: str) -> None:
    print(f"[simctl {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], check: bool = True, capture: bool = False, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, text=True, capture_output=capture, **kw)


def docker_ok() -> bool:
    return shutil.which("docker") is not None and run(["docker", "info"], check=False, capture=True).returncode == 0


# --------------------------------------------------------------------------- host
def ensure_host() -> None:
    """Install what the test bed needs on this machine and start dockerd if none runs."""
    missing = [
        p
        for p, exe in (
            ("docker.io", "dockerd"),
            ("debootstrap", "debootstrap"),
            ("rsync", "rsync"),
            ("openssh-client", "ssh"),
            ("openssh-server", "sshd"),
            ("iproute2", "ip"),
            ("zstd", "zstd"),
            ("docker-registry", "docker-registry"),
        )
        if shutil.which(exe) is None
    ]
    if missing:
        if os.geteuid() != 0:
            sys.exit(f"simctl: need root to install {missing} (apt-get install {' '.join(missing)})")
        log(f"installing {' '.join(missing)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", *missing], env=env)
    if docker_ok():
        return
    log("no Docker engine answers; starting dockerd")
    logf = open("/var/log/sparkops-sim-dockerd.log", "ab")  # noqa: SIM115 - handed to the daemon
    subprocess.Popen(["dockerd"], stdout=logf, stderr=logf, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if docker_ok():
            return
        time.sleep(1)
    sys.exit("simctl: dockerd did not come up in 60 s; see /var/log/sparkops-sim-dockerd.log")


# -------------------------------------------------------------------------- build
def image_exists(ref: str, node: str | None = None) -> bool:
    cmd = ["docker", "image", "inspect", ref]
    if node:
        cmd = ["docker", "exec", node, *cmd]
    return run(cmd, check=False, capture=True).returncode == 0


def spec_hash(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def debootstrap_image(  # noqa: PLR0917 - one call site per image, each spelling out its parts
    ref: str,
    packages: list[str],
    variant: str,
    changes: list[str],
    post: str = "",
    files: dict[str, Path] | None = None,
) -> None:
    if image_exists(ref):
        log(f"{ref}: cached")
        return
    rootfs = STATE / "rootfs" / ref.replace("/", "_").replace(":", "_")
    if rootfs.exists():
        shutil.rmtree(rootfs)
    rootfs.parent.mkdir(parents=True, exist_ok=True)
    log(f"{ref}: debootstrap {SUITE} ({len(packages)} packages; about a minute)")
    t0 = time.monotonic()
    run(
        ["debootstrap", f"--variant={variant}", f"--include={','.join(packages)}", SUITE, str(rootfs), MIRROR],
        capture=True,
    )
    # The nodes never reach a mirror: an apt source pointing at one would only
    # make `apt-get update` fail. The local repository is the one source.
    (rootfs / "etc/apt/sources.list").write_text("")
    for extra in (rootfs / "etc/apt/sources.list.d").glob("*"):
        extra.unlink()
    run(["chroot", str(rootfs), "apt-get", "clean"], check=False, capture=True)
    if post:
        run(["chroot", str(rootfs), "/bin/sh", "-c", post], capture=True)
    for dest, src in (files or {}).items():
        target = rootfs / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    cmd = ["docker", "import"]
    for change in changes:
        cmd += ["--change", change]
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    run([*cmd, "-", ref], stdin=tar.stdout, capture=True)
    tar.wait()
    shutil.rmtree(rootfs)
    log(f"{ref}: built in {time.monotonic() - t0:.0f} s")


NODE_POST = (
    # sshd: keys only; host keys are made per node at first start.
    "rm -f /etc/ssh/ssh_host_* && "
    "printf 'PermitRootLogin prohibit-password\\nPasswordAuthentication no\\nUseDNS no\\n' "
    "> /etc/ssh/sshd_config.d/sparkops-sim.conf && "
    "echo 'deb [trusted=yes] file:/srv/sparkops-sim/apt ./' > /etc/apt/sources.list.d/sparkops-sim.list && "
    # Keep dockerd's iptables NAT out of the way of the node's own firewall rules.
    'mkdir -p /etc/docker && echo \'{"storage-driver": "overlay2", "log-driver": "json-file"}\' '
    "> /etc/docker/daemon.json"
)


def node_image_ref() -> str:
    entry = (SIM / "node/entrypoint.sh").read_text()
    return f"{PREFIX}/node:{spec_hash(SUITE, NODE_PACKAGES, NODE_POST, entry)}"


def vllm_base_ref() -> str:
    return f"{PREFIX}/vllm-base:bookworm"


def build_images() -> None:
    node_ref = node_image_ref()
    debootstrap_image(
        node_ref,
        NODE_PACKAGES,
        "minbase",
        ['ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/sbin/sim-node-entrypoint"]'],
        post=NODE_POST,
        files={"/usr/local/sbin/sim-node-entrypoint": SIM / "node/entrypoint.sh"},
    )
    vbase = vllm_base_ref()
    tagged = f"{PREFIX}/vllm-base:{spec_hash(SUITE, VLLM_BASE_PACKAGES)}"
    debootstrap_image(tagged, VLLM_BASE_PACKAGES, "minbase", ['CMD ["/bin/bash"]'])
    run(["docker", "tag", tagged, vbase])


def build_wheels() -> Path:
    wheels = STATE / "wheels" / f"ray-{RAY_VERSION}-hf-{HF_HUB_VERSION}-{platform.machine()}"
    marker = wheels / ".complete"
    if marker.exists():
        log(f"Ray {RAY_VERSION} wheels: cached")
        return wheels
    wheels.mkdir(parents=True, exist_ok=True)
    log(f"downloading Ray {RAY_VERSION}, huggingface_hub {HF_HUB_VERSION} wheels (Python 3.11, {platform.machine()})")
    plat = {"x86_64": "manylinux2014_x86_64", "aarch64": "manylinux2014_aarch64"}[platform.machine()]
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--platform",
            plat,
            "--platform",
            plat.replace("2014", "_2_17"),
            "--platform",
            plat.replace("manylinux2014", "manylinux_2_28"),
            "-d",
            str(wheels),
            f"ray=={RAY_VERSION}",
            f"huggingface_hub=={HF_HUB_VERSION}",
        ]
    )
    marker.write_text("ok\n")
    return wheels


# The nodes' platform for the gateway's wheels: Debian 12 (glibc 2.36, CPython 3.11) on this machine's arch.
NODE_GLIBC = "2.36"
NODE_PYTHON = "3.11.2"  # exact: environment markers compare the micro version (gateway.missing_requirements)


def gateway_requirements() -> list[str]:
    """The gateway's pins as roles/sparkops_defaults gives them (one place), the version filled in."""
    import yaml  # noqa: PLC0415 - the dev venv that runs simctl has it (ansible needs it)

    data = yaml.safe_load((ROOT / "roles/sparkops_defaults/defaults/main/cluster.yml").read_text())
    version = str(data["sparkops_gateway_litellm_version"])
    return [r.replace("{{ sparkops_gateway_litellm_version }}", version) for r in data["sparkops_gateway_requirements"]]


# The test bed's package index, PyPI's stand-in for the nodes (sim/differences.yml): the gateway's wheels for
# the nodes' platform, downloaded once from PyPI by playbooks/gateway_wheels.yml's own function, served as PEP
# 503 simple pages by Python's http.server on the management bridge. The head installs LiteLLM from it as a
# Spark does from PyPI (roles/gateway: no wheelhouse on the controller, sparkops_gateway_index_url).
PYPI = STATE / "pypi"
PYPI_PORT = 5090
PYPI_INDEX_URL = f"http://{REGISTRY_HOST}:{PYPI_PORT}/simple/"
PYPI_MARKER = (b"-m\0http.server\0", f"--bind\0{REGISTRY_HOST}\0{PYPI_PORT}\0".encode())


def build_gateway_wheels() -> Path:
    """The gateway's wheels for the nodes' platform (the files of the test bed's index, write_simple_index).
    Not in the role's default wheelhouse folder: the test bed installs from the index, as a site without one
    does. Cached: about 170 MB, downloaded once."""
    spec = importlib.util.spec_from_file_location("sparkops_gateway_plan", ROOT / "plugins/plugin_utils/gateway.py")
    gateway = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gateway)
    arch = platform.machine()
    dest = PYPI / "files" / gateway.wheelhouse_name(arch, NODE_PYTHON)
    requirements = gateway_requirements()
    marker = dest / ".complete"
    earlier = STATE / "wheelhouse" / "gateway" / dest.name  # where an earlier test bed kept them: moved, not fetched
    if earlier.is_dir() and not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(earlier), dest)
    shutil.rmtree(STATE / "wheelhouse", ignore_errors=True)
    if marker.exists() and marker.read_text() == json.dumps([*requirements, NODE_PYTHON]):
        log(f"gateway wheels ({', '.join(requirements)}): cached")
    else:
        dest.mkdir(parents=True, exist_ok=True)
        log(f"downloading the gateway's wheels ({', '.join(requirements)}; CPython {NODE_PYTHON}, {arch}; ~170 MB)")
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
        gateway.download_wheelhouse(
            pip, str(dest), requirements, arch=arch, python=NODE_PYTHON, glibc=NODE_GLIBC, run=run
        )
        marker.write_text(json.dumps([*requirements, NODE_PYTHON]))
        (PYPI / "simple").mkdir(parents=True, exist_ok=True)
        (PYPI / "simple" / "index.html").unlink(missing_ok=True)  # the pages follow the new files
    # The pages hash 170 MB of wheels: written after a download (or when missing), not at every `up`.
    if not (PYPI / "simple" / "index.html").exists():
        write_simple_index(dest)
    return dest


def write_simple_index(files: Path) -> None:
    """PEP 503 pages for the wheels in `files`: simple/index.html lists each project, simple/<normalized
    name>/index.html links its files with their sha256 (pip checks it, as it does PyPI's)."""
    from packaging.utils import canonicalize_name, parse_wheel_filename  # noqa: PLC0415 - pip's own, in the venv

    projects: dict[str, list[str]] = {}
    for whl in sorted(files.glob("*.whl")):
        name = canonicalize_name(parse_wheel_filename(whl.name)[0])
        digest = hashlib.sha256(whl.read_bytes()).hexdigest()
        rel = f"../../files/{files.name}/{whl.name}"
        projects.setdefault(name, []).append(f'<a href="{rel}#sha256={digest}">{whl.name}</a><br/>')
    simple = PYPI / "simple"
    shutil.rmtree(simple, ignore_errors=True)
    for name, links in projects.items():
        (simple / name).mkdir(parents=True)
        page = "\n".join(links)
        (simple / name / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{page}\n</body></html>\n")
    rows = "\n".join(f'<a href="{name}/">{name}</a><br/>' for name in sorted(projects))
    (simple / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{rows}\n</body></html>\n")


def git(repo: Path, *args: str, env: dict | None = None) -> str:
    base_env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "sparkops sim",
        "GIT_AUTHOR_EMAIL": "sim@sparkops.invalid",
        "GIT_COMMITTER_NAME": "sparkops sim",
        "GIT_COMMITTER_EMAIL": "sim@sparkops.invalid",
        "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
    }
    if env:
        base_env.update(env)
    return run(["git", "-C", str(repo), *args], capture=True, env=base_env).stdout.strip()


def build_standin_repo() -> None:
    """A local git repository standing in for eugr/spark-vllm-docker.

    Branches: sim-v1 (the deployed version), sim-v2 (an upgrade: same double,
    another commit), sim-broken (an image whose `vllm` exits at start: an
    upgrade to it must be rolled back). Commits are deterministic.
    """
    bare = STATE / "git" / "spark-vllm-docker.git"
    src = sorted(p for p in (SIM / "standin").iterdir() if p.is_file())
    want = spec_hash([(p.name, p.read_bytes().hex()) for p in src])
    stamp = STATE / "git" / ".spec"
    if bare.exists() and stamp.exists() and stamp.read_text() == want:
        log("stand-in spark-vllm-docker repository: cached")
        return
    if bare.exists():
        shutil.rmtree(bare)
    work = STATE / "git" / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    git(work, "init", "-q", "-b", "sim-v1")
    for p in src:
        shutil.copy2(p, work / p.name)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "stand-in v1")
    git(work, "checkout", "-q", "-b", "sim-v2")
    (work / "CHANGELOG").write_text("v2: an upgrade that changes nothing that matters\n")
    git(work, "add", "-A")
    git(
        work,
        "commit",
        "-q",
        "-m",
        "stand-in v2",
        env={"GIT_COMMITTER_DATE": "2026-01-02T00:00:00Z", "GIT_AUTHOR_DATE": "2026-01-02T00:00:00Z"},
    )
    git(work, "checkout", "-q", "-b", "sim-broken", "sim-v1")
    (work / "vllm").write_text(
        "#!/bin/sh\n# A deliberately broken build: the engine dies at start (for rollback tests). It still\n"
        "# answers --help, so the upgrade's option check passes and the failure comes at the swap.\n"
        'case " $* " in *" --help"*) exec python3 /opt/sparkops/vllm_test_double.py "$@" ;; esac\n'
        "echo 'RuntimeError: simulated broken image: engine failed to start' >&2\nexit 1\n"
    )
    git(work, "add", "-A")
    git(
        work,
        "commit",
        "-q",
        "-m",
        "stand-in broken",
        env={"GIT_COMMITTER_DATE": "2026-01-03T00:00:00Z", "GIT_AUTHOR_DATE": "2026-01-03T00:00:00Z"},
    )
    run(["git", "clone", "-q", "--bare", str(work), str(bare)], capture=True)
    shutil.rmtree(work)
    stamp.write_text(want)
    # The stand-in's history was rewritten (its commits follow its files): a lock file that pins
    # commits of the old history pins what no longer exists, as after a force-push upstream.
    lock = STATE / "sparkops.lock.json"
    if lock.exists():
        lock.unlink()
        log(f"stand-in repository rebuilt: its commits changed, so the simulated cluster's lock file {lock} is reset")
    log(f"stand-in repository at {bare}: sim-v1 {git(bare, 'rev-parse', 'sim-v1')[:12]}")


def build_apt_repo() -> None:
    out = STATE / "apt"
    if (out / "Release").exists():
        log("dummy NVIDIA apt repository: cached")
        return
    run([sys.executable, str(SIM / "apt/make_repo.py"), str(out)])
    log(f"dummy NVIDIA apt repository at {out}")


def build_all(gateway_wheels: bool = True) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    build_images()
    wheels = build_wheels()
    shared = STATE / "shared"
    shared.mkdir(exist_ok=True)
    link = shared / "wheels"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(wheels)
    if gateway_wheels:
        build_gateway_wheels()
    build_standin_repo()
    build_apt_repo()


# ----------------------------------------------------------------------------- up
def ssh_key() -> Path:
    key = STATE / "ssh" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparkops-sim", "-f", str(key)])
    return key


def container_state(name: str) -> str | None:
    res = run(["docker", "inspect", "-f", "{{.State.Status}}", name], check=False, capture=True)
    return res.stdout.strip() if res.returncode == 0 else None


def allow_routed_within(name: str) -> None:
    """Let frames that a ring node routes cross its cable's bridge.

    Docker drops, on an --internal network, every frame whose address is outside the network's
    subnet (DOCKER-ISOLATION-STAGE-1, seen by iptables through br_netfilter). A ring node forwards
    packets for non-neighbours, whose addresses are on other cables' subnets: accept frames that
    stay on the same bridge (DOCKER-USER runs first). Nothing leaves the bridge.
    """
    net_id = run(["docker", "network", "inspect", "-f", "{{.Id}}", name], capture=True).stdout.strip()
    bridge = f"br-{net_id[:12]}"
    rule = ["DOCKER-USER", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
    if run(["iptables", "-C", *rule], check=False, capture=True).returncode != 0:
        run(["iptables", "-I", *rule], capture=True)


def remove_network(name: str) -> None:
    """Remove a test-bed network and, for a ring cable, the DOCKER-USER rule made for it."""
    if "-ring-" in name:
        res = run(["docker", "network", "inspect", "-f", "{{.Id}}", name], check=False, capture=True)
        if res.returncode == 0:
            bridge = f"br-{res.stdout.strip()[:12]}"
            run(
                ["iptables", "-D", "DOCKER-USER", "-i", bridge, "-o", bridge, "-j", "ACCEPT"], check=False, capture=True
            )
    run(["docker", "network", "rm", name], check=False, capture=True)


# A Linux bridge drops frames to the IEEE link-local group 01:80:c2:00:00:0e (LLDP) unless bit 14 of
# its group_fwd_mask is set (kernel Documentation/ABI: bridge group_fwd_mask; bits 0-2 may not be set).
# The "cables" of the test bed are bridges: let LLDP cross them, as it crosses a real cable.
LLDP_FWD_BIT = 1 << 0x0E


def forward_lldp(name: str, sys_class_net: str = "/sys/class/net") -> None:
    """Let the LLDP frames of discover.yml cross a fast network's bridge (not the management LAN's)."""
    net_id = run(["docker", "network", "inspect", "-f", "{{.Id}}", name], capture=True).stdout.strip()
    path = Path(sys_class_net) / f"br-{net_id[:12]}" / "bridge" / "group_fwd_mask"
    mask = int(path.read_text().strip(), 0)
    if not mask & LLDP_FWD_BIT:
        path.write_text(f"{mask | LLDP_FWD_BIT:#x}\n")


def ensure_networks() -> None:
    for name, (subnet, mtu) in NETWORKS.items():
        if run(["docker", "network", "inspect", name], check=False, capture=True).returncode == 0:
            if "-ring-" in name:
                allow_routed_within(name)
            if name != f"{PREFIX}-mgmt":
                forward_lldp(name)
            continue
        run(
            [
                "docker",
                "network",
                "create",
                "--internal",
                "--subnet",
                subnet,
                "-o",
                f"com.docker.network.driver.mtu={mtu}",
                name,
            ],
            capture=True,
        )
        if "-ring-" in name:
            allow_routed_within(name)
        if name != f"{PREFIX}-mgmt":
            forward_lldp(name)


def remove_other_nodes() -> None:
    """Remove node containers and networks of another size or topology than the one wanted."""
    wanted = {node["name"] for node in NODES}
    res = run(["docker", "ps", "-a", "--filter", "label=io.sparkops.sim=node", "--format", "{{.Names}}"], capture=True)
    for name in res.stdout.split():
        if name not in wanted:
            log(f"{name}: not part of this topology; removing it")
            run(["docker", "rm", "-f", "-v", name], check=False, capture=True)
            run(["docker", "volume", "rm", "-f", f"{name}-docker"], check=False, capture=True)
    res = run(["docker", "network", "ls", "--filter", f"name={PREFIX}-", "--format", "{{.Name}}"], capture=True)
    stale = [net for net in res.stdout.split() if net.startswith(f"{PREFIX}-") and net not in NETWORKS]
    if stale:
        # A node still attached to a stale network is a node of the old topology: replace it.
        for node in NODES:
            attached = run(
                [
                    "docker",
                    "inspect",
                    "-f",
                    "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
                    node["name"],
                ],
                check=False,
                capture=True,
            ).stdout.split()
            if set(attached) & set(stale):
                log(f"{node['name']}: wired for another topology; replacing it")
                run(["docker", "rm", "-f", "-v", node["name"]], check=False, capture=True)
                run(["docker", "volume", "rm", "-f", f"{node['name']}-docker"], check=False, capture=True)
        for net in stale:
            remove_network(net)


def node_config_id(node: dict, image: str, key: Path) -> str:
    """What a node container was made from: this checkout's state dir, the image, the SSH key.

    A container left by another checkout (or another CI run on a shared Docker engine) has the
    same name but authorizes another key and mounts another state dir: it must be replaced,
    never reused.
    """
    pub = Path(f"{key}.pub").read_text(encoding="utf-8")
    blob = json.dumps([str(STATE.resolve()), image, pub, node], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def start_node(node: dict, image: str, key: Path) -> None:
    name = node["name"]
    config_id = node_config_id(node, image, key)
    state = container_state(name)
    if state is not None:
        res = run(
            ["docker", "inspect", "-f", '{{index .Config.Labels "io.sparkops.sim.config"}}', name],
            check=False,
            capture=True,
        )
        if res.stdout.strip() != config_id:
            log(f"{name}: replacing a container made by another checkout or an older image/key")
            run(["docker", "rm", "-f", "-v", name], check=False, capture=True)
            run(["docker", "volume", "rm", "-f", f"{name}-docker"], check=False, capture=True)
            state = None
    if state == "running":
        return
    if state is not None:
        run(["docker", "start", name], capture=True)
        return
    ifaces = [f"{node['mgmt']}={MGMT_IFACE}"] + [f"{addr}={ifname}" for addr, ifname, _ in node["fast"]]
    cmd = [
        "docker",
        "run",
        "-d",
        "--name",
        name,
        "--hostname",
        name,
        "--network",
        f"{PREFIX}-mgmt",
        "--ip",
        node["mgmt"],
        "--security-opt",
        "seccomp=unconfined",
        "--security-opt",
        "apparmor=unconfined",
        "--cgroupns",
        "host",
        "--restart",
        "no",
        "--stop-timeout",
        "5",
        "-v",
        f"{name}-docker:/var/lib/docker",
        "-v",
        f"{key}.pub:/sim/authorized_keys:ro",
        "-v",
        f"{STATE / 'apt'}:/srv/sparkops-sim/apt:ro",
        "-v",
        f"{STATE / 'git'}:/srv/sparkops-sim/git:ro",
        "-v",
        f"{(STATE / 'shared' / 'wheels').resolve()}:/srv/sparkops-sim/wheels:ro",
        "--tmpfs",
        "/run",
        "--tmpfs",
        "/tmp",
        "-e",
        f"SIM_IFACES={' '.join(ifaces)}",
        "--label",
        "io.sparkops.sim=node",
        "--label",
        f"io.sparkops.sim.config={config_id}",
    ]
    for cap in CAPS:
        cmd += ["--cap-add", cap]
    for sysctl, value in node.get("sysctls", {}).items():
        cmd += ["--sysctl", f"{sysctl}={value}"]
    run([*cmd, image], capture=True)
    for addr, _ifname, net in node["fast"]:
        run(["docker", "network", "connect", "--ip", addr, net, name], capture=True)


def wait_ssh(key: Path, timeout: float = 240) -> None:
    # 240 s, not 90: replacing a ring's nodes by the pair's (make test's ring stage puts the pair back) has
    # twice left the host unable to reach a new node's sshd for over 90 s while the node had been
    # listening for a while, then reach it within three minutes (cause not found: same IP and MAC as the
    # node it replaced). The host's neighbour entry for the address is flushed every 20 s in case it is
    # stale, and the wait says how long it has waited.
    known = STATE / "ssh" / "known_hosts"
    lines = []
    for node in NODES:
        start = time.monotonic()
        deadline = start + timeout
        flushed = start
        while True:
            res = run(["ssh-keyscan", "-T", "2", "-t", "ed25519", node["mgmt"]], check=False, capture=True)
            if res.returncode == 0 and res.stdout.strip():
                lines.append(res.stdout.strip())
                break
            now = time.monotonic()
            if now > deadline:
                logs = run(["docker", "logs", "--tail", "30", node["name"]], check=False, capture=True)
                sys.exit(
                    f"simctl: sshd on {node['name']} ({node['mgmt']}) did not answer in {timeout:.0f} s\n"
                    f"{logs.stdout}{logs.stderr}"
                )
            if now - flushed >= 20:
                log(f"{node['name']}: sshd at {node['mgmt']} not reached after {now - start:.0f} s; still waiting")
                run(["ip", "neigh", "flush", "to", node["mgmt"]], check=False, capture=True)
                flushed = now
            time.sleep(1)
    known.write_text("\n".join(lines) + "\n")
    for node in NODES:
        res = run(
            [
                "ssh",
                "-i",
                str(key),
                "-o",
                f"UserKnownHostsFile={known}",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=yes",
                f"root@{node['mgmt']}",
                "true",
            ],
            check=False,
            capture=True,
        )
        if res.returncode != 0:
            sys.exit(
                f"simctl: {node['name']} answers on port 22 but refuses this cluster's key "
                f"({key}): {res.stderr.strip()}\nRun `make sim-down` and `make sim-up` to recreate the nodes."
            )


def wait_node_docker(name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run(["docker", "exec", name, "docker", "info"], check=False, capture=True).returncode == 0:
            return
        time.sleep(1)
    sys.exit(
        f"simctl: dockerd inside {name} did not start in {timeout:.0f} s; "
        f"see `docker exec {name} cat /var/log/dockerd.log`"
    )


def load_base_into_nodes() -> None:
    ref = vllm_base_ref()
    image_id = run(["docker", "image", "inspect", "-f", "{{.Id}}", ref], capture=True).stdout.strip()
    for node in NODES:
        name = node["name"]
        wait_node_docker(name)
        res = run(
            ["docker", "exec", name, "docker", "image", "inspect", "-f", "{{.Id}}", ref], check=False, capture=True
        )
        if res.returncode == 0 and res.stdout.strip() == image_id:
            continue
        log(f"{name}: loading {ref} into its dockerd")
        save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
        run(["docker", "exec", "-i", name, "docker", "load", "-q"], stdin=save.stdout, capture=True)
        save.wait()


# The simulated cluster's Hub: tests/system/hub_server.py (the Hub-speaking server the client tests run
# the real huggingface_hub against) on the management bridge, serving the stand-in model with `main` at
# a fixed commit. The head downloads it with the image's own huggingface_hub, as a Spark downloads from
# the Hub, and syncs it to the workers with the default transport: no weights are put on a node by hand.
HUB_PORT, HUB_CDN_PORT = 5080, 5081
HUB_ENDPOINT = f"http://{REGISTRY_HOST}:{HUB_PORT}"
HUB_SERVER = ROOT / "tests" / "system" / "hub_server.py"
# What names the test bed's daemons in a command line, whichever checkout started them: the Hub server
# bound to the management bridge (the system tests run the same server on loopback: those are not ours),
# and the registry (the only docker-registry this machine runs).
HUB_MARKER = (b"tests/system/hub_server.py", f"--address\0{REGISTRY_HOST}\0--port\0{HUB_PORT}\0".encode())
REGISTRY_MARKER = (b"docker-registry\0serve\0",)


def answers_200(url: str) -> bool:
    """A test-bed daemon answers `url` (its own fixed http address) with 200 within 3 s."""
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:  # noqa: S310 - the test bed's fixed http URLs
            return resp.status == 200
    except OSError:
        return False


def hub_answers(model: str) -> bool:
    return answers_200(f"{HUB_ENDPOINT}/api/models/{model}")


def start_daemon(name: str, argv: list, answers, what: str) -> None:
    """Start a test-bed daemon (its log and pid file in .sim/<name>/) and wait until ``answers()``."""
    base = STATE / name
    base.mkdir(parents=True, exist_ok=True)
    logf = open(base / f"{name}.log", "ab")  # noqa: SIM115 - handed to the daemon
    proc = subprocess.Popen(argv, stdout=logf, stderr=logf, start_new_session=True)
    (base / "pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if answers():
            log(f"{what}: started (pid {proc.pid})")
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    sys.exit(f"simctl: {what} did not answer; see {base / f'{name}.log'}")


def daemon_pids(marker: tuple[bytes, ...], proc: Path = Path("/proc")) -> dict[int, str]:
    """Every process on this machine running a test-bed daemon (``marker`` in its command line), whichever
    checkout started it: pid -> its command line, readable. One simulated cluster exists per machine (the
    nodes' names, the bridges' addresses and the daemons' ports are fixed), so a daemon another checkout
    left behind would serve this one's cluster from that checkout's files."""
    found = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if all(part in cmdline for part in marker):
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def _alive(entry: Path) -> bool:
    """A process that still runs: its /proc entry exists and it is not a zombie waiting to be reaped."""
    try:
        return entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_daemon(name: str, marker: tuple[bytes, ...], proc: Path = Path("/proc"), timeout_s: float = 10) -> list[str]:
    """Stop every process running this test-bed daemon (``marker`` in its command line): the one this
    checkout started (its pid file) and any other checkout's. Returns what was stopped, each naming the
    command line (so the checkout that held it), and waits, bounded, until they are gone."""
    (STATE / name / "pid").unlink(missing_ok=True)
    stopped = daemon_pids(marker, proc)
    for pid in stopped:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(proc / str(pid)) for pid in stopped):
        time.sleep(0.1)
    for pid in stopped:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return [f"pid {pid}: {cmd}" for pid, cmd in sorted(stopped.items())]


def own_daemon_runs(name: str, marker: tuple[bytes, ...], proc: Path = Path("/proc")) -> bool:
    """This checkout's daemon runs: its pid file names a live process that runs ``marker`` from this
    checkout (its command line names this checkout's state folder or files)."""
    try:
        pid = int((STATE / name / "pid").read_text())
        cmdline = (proc / str(pid) / "cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    ours = (str(ROOT).encode(), str(STATE.resolve()).encode())
    return all(part in cmdline for part in marker) and any(path in cmdline for path in ours)


def ensure_daemon(name: str, marker: tuple[bytes, ...], argv: list, answers, what: str) -> None:
    """This checkout's daemon, answering: kept if it is ours and answers; otherwise every process running
    it (another checkout's included, named in the log) is stopped first and ours is started."""
    if own_daemon_runs(name, marker) and answers():
        log(f"{what}: up")
        return
    for held in stop_daemon(name, marker):
        log(f"{what}: stopped a daemon this checkout did not start ({held})")
    start_daemon(name, argv, answers, what)


def ensure_hub(model: str, revision: str, shards: int, shard_mib: int) -> None:
    argv = [sys.executable, str(HUB_SERVER), "--address", REGISTRY_HOST, "--port", str(HUB_PORT)]
    argv += ["--cdn-port", str(HUB_CDN_PORT), "--model", model, "--commit", revision]
    argv += ["--shards", str(shards), "--shard-mib", str(shard_mib)]
    what = f"Hub at {HUB_ENDPOINT} ({model}@main={revision[:12]})"
    ensure_daemon("hub", HUB_MARKER, argv, lambda: hub_answers(model), what)


def ensure_pypi() -> None:
    """Serve the test bed's index (build_gateway_wheels wrote it) on the management bridge."""
    argv = [sys.executable, "-m", "http.server", "--bind", REGISTRY_HOST, str(PYPI_PORT), "--directory", str(PYPI)]
    answers, what = lambda: answers_200(f"{PYPI_INDEX_URL}litellm/"), f"package index at {PYPI_INDEX_URL}"
    ensure_daemon("pypi", PYPI_MARKER, argv, answers, what)


def registry_answers() -> bool:
    return answers_200(f"http://{REGISTRY_ADDR}/v2/")


def ensure_registry() -> None:
    """Start the test bed's registry (once; its storage is in .sim/registry) on the management bridge."""
    base = STATE / "registry"
    (base / "data").mkdir(parents=True, exist_ok=True)
    config = base / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {base / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: {REGISTRY_ADDR}\n"
    )
    argv = ["docker-registry", "serve", str(config)]
    ensure_daemon("registry", REGISTRY_MARKER, argv, registry_answers, f"registry at {REGISTRY_ADDR}")


NODE_REGISTRY_SCRIPT = """
set -e
python3 - "$1" <<'PY'
import json, sys
path = "/etc/docker/daemon.json"
conf = json.load(open(path))
regs = conf.setdefault("insecure-registries", [])
if sys.argv[1] not in regs:
    regs.append(sys.argv[1])
    json.dump(conf, open(path, "w"))
PY
pkill -HUP -x dockerd
"""


def configure_node_registries() -> None:
    """Give each node's dockerd the registry as an insecure one (a live reload: SIGHUP, no restart)."""
    for node in NODES:
        run(["docker", "exec", node["name"], "bash", "-c", NODE_REGISTRY_SCRIPT, "-", REGISTRY_ADDR], capture=True)
        deadline = time.monotonic() + 20
        while True:
            res = run(
                ["docker", "exec", node["name"], "docker", "info", "--format", "{{json .RegistryConfig.IndexConfigs}}"],
                check=False,
                capture=True,
            )
            if REGISTRY_ADDR in res.stdout:
                break
            if time.monotonic() > deadline:
                sys.exit(f"simctl: {node['name']}'s dockerd did not take {REGISTRY_ADDR} as an insecure registry")
            time.sleep(0.5)


# A registry stack's image (roles/sparkops_defaults/defaults/main/stacks.yml, `image.source: registry`, e.g.
# vllm/vllm-openai:v0.33.0-aarch64) comes, in the test bed, from its registry under the same path and tag
# (inventory/sim's spark_vllm_image_registry_image; a listed difference): a stand-in of that release, built
# on the head from sim/standin with the stack's versions, as vLLM's own image carries them. Like vLLM's image
# it has ENTRYPOINT ["vllm", "serve"] (vllm-project/vllm docker/Dockerfile, its last stage `vllm-openai`), which
# sparkops' thin layer must clear. Built and pushed once: the registry's storage outlives `down`.
STACK_BUILD_SCRIPT = r"""
set -euo pipefail
ctx=$1 ref=$2 version=$3 commit=$4 flashinfer=$5 torch=$6 cuda=$7
cp -r /srv/sparkops-sim/wheels "$ctx/wheels"
ray=$(find "$ctx/wheels" -maxdepth 1 -name 'ray-*.whl' -printf '%f\n' | head -1 | cut -d- -f2)
docker build --quiet --network none -t sparkops-sim/stack-standin:build \
    --build-arg "VLLM_VERSION=$version" --build-arg "VLLM_COMMIT=$commit" \
    --build-arg "FLASHINFER_VERSION=$flashinfer" --build-arg "TORCH_VERSION=$torch" \
    --build-arg "NCCL_VERSION=2.28.9" --build-arg "CUDA_VERSION=$cuda" --build-arg "RAY_VERSION=$ray" "$ctx" >/dev/null
printf 'FROM sparkops-sim/stack-standin:build\nENTRYPOINT ["vllm", "serve"]\n' \
    | docker build --quiet --network none -t "$ref" - >/dev/null
docker push --quiet "$ref" >/dev/null
# Gone from the head again: the first deployment pulls it from the registry, as from Docker Hub.
docker image rm "$ref" sparkops-sim/stack-standin:build >/dev/null
rm -rf "$ctx"
"""


def registry_stacks() -> dict:
    """{name: stack} of the shipped stacks whose image comes from a registry by tag."""
    import yaml  # noqa: PLC0415 - the dev venv that runs simctl has it (ansible needs it)

    data = yaml.safe_load((ROOT / "roles/sparkops_defaults/defaults/main/stacks.yml").read_text())
    return {
        name: stack
        for name, stack in data["sparkops_stacks"].items()
        if stack["image"]["source"] == "registry" and stack["image"].get("registry_image")
    }


def registry_has(repo_tag: str) -> bool:
    repo, tag = repo_tag.rsplit(":", 1)
    req = urllib.request.Request(  # noqa: S310 - fixed http URL of the test bed's registry
        f"http://{REGISTRY_ADDR}/v2/{repo}/manifests/{tag}", method="HEAD",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:  # noqa: S310
            return resp.status == 200
    except OSError:
        return False


def push_stack_images() -> None:
    """Each registry stack's stand-in image in the test bed's registry (built on the head once)."""
    head = NODES[0]["name"]
    for name, stack in registry_stacks().items():
        repo_tag = stack["image"]["registry_image"]
        if registry_has(repo_tag):
            log(f"{REGISTRY_ADDR}/{repo_tag} ({name}): in the registry")
            continue
        t0 = time.monotonic()
        ctx = f"/var/tmp/sparkops-stack-{name}"  # not /tmp: a tmpfs on the node, which `docker cp` cannot write
        run(["docker", "exec", head, "rm", "-rf", ctx])
        run(["docker", "cp", str(ROOT / "sim" / "standin"), f"{head}:{ctx}"])
        pins = stack.get("pins") or {}
        torch = f"{pins.get('torch') or '2.14.0'}+cu130"
        argv = [ctx, f"{REGISTRY_ADDR}/{repo_tag}", str(stack["vllm_version"]), str(stack["vllm_commit"]),
                str(pins.get("flashinfer") or "0.0.0"), torch, str(pins.get("cuda") or "13.0.2")]  # fmt: skip
        run(["docker", "exec", head, "bash", "-c", STACK_BUILD_SCRIPT, "-", *argv], capture=True)
        log(f"{REGISTRY_ADDR}/{repo_tag} ({name}): a stand-in of vLLM {stack['vllm_version']} pushed "
            f"({time.monotonic() - t0:.0f} s)")  # fmt: skip


# Where the inventory finds this cluster's SSH key and known_hosts: an absolute path written into the
# inventory itself (git-ignored), so a copy of inventory/sim made anywhere still connects; no path
# relative to the checkout is needed.
INVENTORY_STATE_FILE = ROOT / "inventory" / "sim" / "group_vars" / "all" / "sim_state.yml"


def write_inventory_state(state: Path = STATE, dest: Path = INVENTORY_STATE_FILE) -> Path:
    dest.write_text(
        "---\n"
        "# Written by sim/simctl.py up (git-ignored): this simulated cluster's state directory, absolute,\n"
        "# so that a copy of this inventory made elsewhere finds the SSH key and known_hosts.\n"
        f"sparkops_sim_state_dir: {json.dumps(str(state.resolve()))}\n"
    )
    return dest


def write_inventory_facts(key: Path) -> None:
    facts = {
        "ssh_key": str(key),
        "known_hosts": str(STATE / "ssh" / "known_hosts"),
        "nodes": NODES,
        "standin_repo": "file:///srv/sparkops-sim/git/spark-vllm-docker.git",
        "registry": REGISTRY_ADDR,
    }
    (STATE / "cluster.json").write_text(json.dumps(facts, indent=2) + "\n")


class Beside:
    """fn() in a thread beside what follows; join() waits for it and raises what it raised."""

    def __init__(self, fn) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - handed to join(), which raises it in the caller
            self.error = err

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def up(args: argparse.Namespace) -> None:
    configure(args.nodes, args.topology)
    ensure_host()
    STATE.mkdir(parents=True, exist_ok=True)
    # The gateway's wheels (pip, about 170 MB; 25 s on 2 cores even from pip's cache) are read by the package
    # index only, the last step: fetched beside the nodes' start and the registry's stand-in images.
    gateway_wheels = Beside(build_gateway_wheels)
    build_all(gateway_wheels=False)
    key = ssh_key()
    remove_other_nodes()
    ensure_networks()
    image = node_image_ref()
    for node in NODES:
        start_node(node, image, key)
    wait_ssh(key)
    load_base_into_nodes()
    ensure_registry()
    configure_node_registries()
    push_stack_images()
    ensure_hub(args.model, args.revision, args.shards, args.shard_mib)
    gateway_wheels.join()
    ensure_pypi()
    write_inventory_facts(key)
    write_inventory_state()
    inv = write_topology_inventory(args.nodes, args.topology)
    log("simulated cluster is up: " + ", ".join(f"{n['name']} ({n['mgmt']})" for n in NODES))
    log(f"{args.topology} of {args.nodes} nodes; inventory: {inv}")


def down(args: argparse.Namespace) -> None:
    if args.reset_state:
        # What a deployment left on the controller (its lock, API key, reports, the bigger clusters'
        # inventories): a new cluster starts without it. The caches (images, wheels, repositories) stay.
        for name in ("sparkops.lock.json", "reports", "credentials", "inventories"):
            path = STATE / name
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    if not docker_ok():
        log("no Docker engine: nothing to remove")
        return
    # Every node and network of the test bed, whatever size and topology made them.
    res = run(["docker", "ps", "-a", "--filter", "label=io.sparkops.sim=node", "--format", "{{.Names}}"], capture=True)
    names = sorted(set(res.stdout.split()) | {node["name"] for node in NODES})
    for name in names:
        run(["docker", "rm", "-f", "-v", name], check=False, capture=True)
        if not args.keep_volumes:
            run(["docker", "volume", "rm", "-f", f"{name}-docker"], check=False, capture=True)
    res = run(["docker", "network", "ls", "--filter", f"name={PREFIX}-", "--format", "{{.Name}}"], capture=True)
    for name in sorted(set(res.stdout.split()) | set(NETWORKS)):
        if name.startswith(f"{PREFIX}-"):
            remove_network(name)
    for name, marker in (("registry", REGISTRY_MARKER), ("hub", HUB_MARKER), ("pypi", PYPI_MARKER)):
        for held in stop_daemon(name, marker):
            log(f"{name}: stopped {held}")
    if args.all:
        for ref in (node_image_ref(), vllm_base_ref()):
            run(["docker", "image", "rm", "-f", ref], check=False, capture=True)
        shutil.rmtree(STATE, ignore_errors=True)
        INVENTORY_STATE_FILE.unlink(missing_ok=True)
        log("simulated cluster removed with its images and state; dockerd keeps running (stop it yourself)")
        return
    log(
        "simulated cluster removed (nodes, networks, volumes). Kept for the next `make sim`: dockerd, the "
        f"images {node_image_ref()} and {vllm_base_ref()} (~860 MB) and {STATE.resolve()}; "
        "`make sim-destroy` removes the images and that folder too"
    )


# ------------------------------------------------------------------------ cabling faults
# A ring's cable c joins port 0 of node c to port 1 of node c+1 (configure): one Docker network per
# twin lane. `unplug` takes a cable's links down at both ends (the bridge's ports lose carrier: each
# node keeps its netdevs, NO-CARRIER, as a Spark shows an unplugged QSFP port); `cross` swaps the port-1
# ends of two cables (docker network disconnect/connect, the new link renamed to the netdev the port had);
# `replug` puts every cable back as `up` made it. Each is idempotent and bounded in time.
CABLE_TIMEOUT_S = 60


def ring_size() -> int:
    """The number of nodes of the ring that is up (one network per cable and twin), or exit."""
    res = run(["docker", "network", "ls", "--filter", f"name={PREFIX}-ring-", "--format", "{{.Name}}"], capture=True)
    cables = {name for name in res.stdout.split() if name.startswith(f"{PREFIX}-ring-c") and name.endswith("t0")}
    if len(cables) < 3:
        sys.exit("simctl: no simulated ring is up; start one with `simctl up --nodes 4 --topology ring`")
    return len(cables)


def cable_label(n: int, c: int) -> str:
    a, b = NODES[c]["name"], NODES[(c + 1) % n]["name"]
    return f"cable {c}: {a} port 0 ({'/'.join(PORT0)}) - {b} port 1 ({'/'.join(PORT1)})"


def ring_wiring(n: int, crossed: tuple[int, int] | None = None) -> dict:
    """Per node, the ring networks it is attached to: {node: {network: (address, netdev)}}.

    crossed=(c, e): the port-1 ends of cables c and e swapped (node c+1's port 1 on cable e's networks
    and node e+1's on cable c's), each with an address of its new network's subnet, so the two cables
    end at the wrong Sparks while every netdev keeps its name.
    """
    wiring: dict = {node["name"]: {} for node in NODES}
    for node in NODES:
        for addr, ifname, net in node["fast"]:
            wiring[node["name"]][net] = (addr, ifname)
    if crossed:
        c, e = crossed
        b, d = NODES[(c + 1) % n]["name"], NODES[(e + 1) % n]["name"]
        for t in range(2):
            net_c, net_e = f"{PREFIX}-ring-c{c}t{t}", f"{PREFIX}-ring-c{e}t{t}"
            del wiring[b][net_c], wiring[d][net_e]
            wiring[b][net_e] = (f"10.214.{2 * e + t}.{11 + (c + 1) % n}", PORT1[t])
            wiring[d][net_c] = (f"10.214.{2 * c + t}.{11 + (e + 1) % n}", PORT1[t])
    return wiring


def attached(name: str) -> dict:
    """{ring network: address} that a node is attached to now."""
    fmt = "{{json .NetworkSettings.Networks}}"
    nets = json.loads(run(["docker", "inspect", "-f", fmt, name], capture=True, timeout=CABLE_TIMEOUT_S).stdout)
    return {net: v.get("IPAddress") for net, v in nets.items() if net.startswith(f"{PREFIX}-ring-")}


# Inside a node: the link Docker just connected carries the address; name it as the Spark's port (the
# entrypoint's rename, bounded: Docker may still be renaming veth* -> eth* when the address shows).
RENAME_SCRIPT = """
addr=$1 name=$2 deadline=$((SECONDS + $3))
while :; do
    dev=$(ip -o -4 addr show | awk -v a="$addr" '{split($4, p, "/"); if (p[1] == a) print $2}')
    dev=${dev%%@*}
    [ -n "$dev" ] && [ "$dev" = "$name" ] && break
    [ -n "$dev" ] && ip link set dev "$dev" down 2>/dev/null && ip link set dev "$dev" name "$name" 2>/dev/null
    [ "$SECONDS" -ge "$deadline" ] && { echo "address $addr is on '${dev:-no link}', not $name" >&2; exit 1; }
    sleep 0.2
done
ip link set dev "$name" up
ip -o -4 addr show dev "$name" | grep -q " $addr/" || { echo "address $addr lost after the rename" >&2; exit 1; }
"""


def node_links(name: str) -> dict:
    """{IPv4 address: netdev} inside a node."""
    out = {}
    for line in node_sh(name, "ip -o -4 addr show").splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "inet":
            out[parts[3].split("/")[0]] = parts[1].split("@")[0]
    return out


def rewire(wiring: dict) -> list:
    """Attach each node to exactly its wanted ring networks (at the wanted address, as the wanted netdev).

    A network counts as attached only when Docker says so AND the node has the address on the wanted
    netdev: a connect that failed half-way (Docker's endpoint made, the link not) is done again.
    """
    changed = []
    for name, want in wiring.items():
        now, links = attached(name), node_links(name)
        ok = {net for net, (addr, ifname) in want.items() if now.get(net) == addr and links.get(addr) == ifname}
        for net, addr in now.items():
            if net in ok:
                continue
            cmd = ["docker", "network", "disconnect", "-f", net, name]
            run(cmd, check=False, capture=True, timeout=CABLE_TIMEOUT_S)
            # Docker deletes the link by the name it gave it (eth<N>): the renamed one stays behind.
            if links.get(addr):
                node_sh(name, f"ip link del {links[addr]} 2>/dev/null || true")
            changed.append(f"{name} off {net}")
        for net, (addr, ifname) in want.items():
            if net in ok:
                continue
            # The port's name must be free for the new link (a link left by an earlier disconnect may hold
            # it), and Docker refuses an address whose subnet the node routes elsewhere: a converged ring
            # node routes every other cable's subnet (roce_network); site.yml puts back the routes it needs.
            subnet = NETWORKS[net][0]
            node_sh(name, f"ip link del {ifname}; for i in 1 2 3 4; do ip route del {subnet} || break; done")
            run(["docker", "network", "connect", "--ip", addr, net, name], capture=True, timeout=CABLE_TIMEOUT_S)
            res = run(
                ["docker", "exec", name, "bash", "-c", RENAME_SCRIPT, "-", addr, ifname, "30"],
                check=False,
                capture=True,
                timeout=CABLE_TIMEOUT_S,
            )
            if res.returncode != 0:
                sys.exit(f"simctl: {name}: {res.stderr.strip()}")
            changed.append(f"{name} {ifname} on {net} ({addr})")
    return changed


def node_sh(name: str, script: str) -> str:
    return run(["docker", "exec", name, "sh", "-c", script], capture=True, timeout=CABLE_TIMEOUT_S).stdout.strip()


def bridge_ports(net: str) -> list:
    """The host ends of the links on a network's bridge (its two cable ends)."""
    net_id = run(["docker", "network", "inspect", "-f", "{{.Id}}", net], capture=True).stdout.strip()
    brif = Path("/sys/class/net") / f"br-{net_id[:12]}" / "brif"
    return sorted(p.name for p in brif.iterdir()) if brif.is_dir() else []


def set_cable_carrier(nets: list, up: bool) -> None:
    """A veth loses carrier at both ends when one end goes down: the cable's far ends see NO-CARRIER."""
    for net in nets:
        for port in bridge_ports(net):
            run(["ip", "link", "set", "dev", port, "up" if up else "down"], capture=True, timeout=CABLE_TIMEOUT_S)


def cabling(args: argparse.Namespace) -> None:
    n = ring_size()
    configure(n, "ring")
    for c in getattr(args, "cables", None) or []:
        if not 0 <= c < n:
            sys.exit(f"simctl: the ring of {n} has cables 0 to {n - 1}, not {c}")
    if args.cmd == "unplug":
        (c,) = args.cables
        set_cable_carrier([f"{PREFIX}-ring-c{c}t{t}" for t in range(2)], up=False)
        log(f"unplugged {cable_label(n, c)} (both twins, NO-CARRIER at both ends)")
    elif args.cmd == "cross":
        c, e = args.cables
        if c == e:
            sys.exit("simctl: cross needs two different cables")
        rewire(ring_wiring(n, (c, e)))
        b, d = NODES[(c + 1) % n]["name"], NODES[(e + 1) % n]["name"]
        log(
            f"crossed {cable_label(n, c)} and {cable_label(n, e)}: {NODES[c]['name']} port 0 now meets {d} port 1, "
            f"{NODES[e]['name']} port 0 meets {b} port 1"
        )
    else:
        changed = rewire(ring_wiring(n))
        set_cable_carrier([net for net in NETWORKS if "-ring-" in net], up=True)
        log(f"every cable of the ring of {n} as `up` made it" + (f" ({'; '.join(changed)})" if changed else ""))


def status(_args: argparse.Namespace) -> None:
    for node in NODES:
        print(f"{node['name']}: {container_state(node['name']) or 'absent'} (mgmt {node['mgmt']})")


def limit_memory(args: argparse.Namespace) -> None:
    """Give a node a memory limit (the day-2 memory-floor test), or lift it with 0.

    Docker cannot remove a limit from a running container; "0" sets it to this machine's memory,
    which is no limit at all. Swap is held to the same value so the node really runs out.
    """
    if args.node not in [n["name"] for n in NODES]:
        sys.exit(f"simctl: no node {args.node}")
    size = args.size
    if size == "0":
        size = str(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    run(["docker", "update", "--memory", size, "--memory-swap", size, args.node], capture=True)
    log(f"{args.node}: memory limit {args.size if args.size != '0' else 'lifted'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ensure-host", help="install docker.io/debootstrap and start dockerd if needed")
    sub.add_parser("build", help="build images, wheels, stand-in repository and apt repository (cached)")
    p_up = sub.add_parser("up", help="build what is missing and start both nodes")
    p_up.add_argument("--model", default="sparkops-sim/tiny-test-model")
    p_up.add_argument("--revision", default="5157000000000000000000000000000000000001")
    p_up.add_argument("--shards", type=int, default=4)
    p_up.add_argument("--shard-mib", type=int, default=8)
    p_up.add_argument("--nodes", type=int, default=int(os.environ.get("SIM_NODES", "2")))
    p_up.add_argument("--topology", default=os.environ.get("SIM_TOPOLOGY", "pair"), choices=TOPOLOGIES)
    p_down = sub.add_parser("down", help="remove nodes, networks and volumes")
    p_down.add_argument("--all", action="store_true", help="also remove cached images and .sim/")
    p_down.add_argument("--keep-volumes", action="store_true")
    p_down.add_argument(
        "--reset-state", action="store_true", help="also forget the deployment's lock, key, reports (keeps caches)"
    )
    sub.add_parser("status")
    p_mem = sub.add_parser("limit-memory", help="give a node a memory limit (e.g. 1200m), 0 lifts it")
    p_mem.add_argument("node")
    p_mem.add_argument("size")
    p_ho = sub.add_parser("hosts-only", help="write an inventory of the hosts only (discover.yml's input)")
    p_ho.add_argument("--nodes", type=int, default=int(os.environ.get("SIM_NODES", "2")))
    p_ho.add_argument("--topology", default=os.environ.get("SIM_TOPOLOGY", "pair"), choices=TOPOLOGIES)
    p_inv = sub.add_parser("inventory", help="print the inventory path for --nodes/--topology")
    p_inv.add_argument("--nodes", type=int, default=int(os.environ.get("SIM_NODES", "2")))
    p_inv.add_argument("--topology", default=os.environ.get("SIM_TOPOLOGY", "pair"), choices=TOPOLOGIES)
    p_unplug = sub.add_parser("unplug", help="ring: take cable C's links down at both ends (NO-CARRIER)")
    p_unplug.add_argument("cables", type=int, nargs=1, metavar="C")
    p_cross = sub.add_parser("cross", help="ring: swap the port-1 ends of cables C and E")
    p_cross.add_argument("cables", type=int, nargs=2, metavar="C")
    sub.add_parser("replug", help="ring: every cable back as `up` made it (undoes unplug and cross)")
    args = parser.parse_args()
    if args.cmd == "ensure-host":
        ensure_host()
    elif args.cmd == "build":
        ensure_host()
        build_all()
    elif args.cmd == "up":
        up(args)
    elif args.cmd == "down":
        down(args)
    elif args.cmd == "status":
        status(args)
    elif args.cmd == "limit-memory":
        limit_memory(args)
    elif args.cmd == "inventory":
        print(inventory_dir(args.nodes, args.topology))
    elif args.cmd in ("unplug", "cross", "replug"):
        cabling(args)
    elif args.cmd == "hosts-only":
        configure(args.nodes, args.topology)
        print(write_hosts_only_inventory(args.nodes, args.topology))


if __name__ == "__main__":
    main()
