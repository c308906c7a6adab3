# Copyright: sparkops maintainers
# Apache-2.0
"""Small read-only probes the roles' state modules share (standard library only).

Each role's no-op path reads everything it judges in one module run (preflight_facts, fabric_facts,
fabric_ssh_facts, gpu_facts with files): files' checksums and modes (so a role skips a write whose
result is already in place), interfaces and their MTU from sysfs, IPv4 addresses from `ip -j addr`,
sysctls from /proc/sys, and don't-fragment pings run side by side.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import time


def file_state(path: str) -> dict:
    """exists, kind (file, directory, link, other), mode (four octal digits) and sha1 of a file's bytes."""
    try:
        st = os.lstat(path)
    except OSError:
        return {"exists": False, "kind": None, "mode": None, "sha1": None}
    if stat.S_ISREG(st.st_mode):
        kind = "file"
    elif stat.S_ISDIR(st.st_mode):
        kind = "directory"
    elif stat.S_ISLNK(st.st_mode):
        kind = "link"
    else:
        kind = "other"
    sha1 = None
    if kind == "file":
        digest = hashlib.sha1()  # noqa: S324 - compared with Ansible's hash('sha1') of the rendered file
        try:
            with open(path, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 16), b""):
                    digest.update(chunk)
            sha1 = digest.hexdigest()
        except OSError:
            sha1 = None
    return {"exists": True, "kind": kind, "mode": f"{stat.S_IMODE(st.st_mode):04o}", "sha1": sha1}


def file_states(paths: list) -> dict:
    return {p: file_state(p) for p in paths}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def interfaces(sys_class_net: str = "/sys/class/net") -> dict:
    """Every network interface the kernel lists (what Ansible's interfaces fact lists) with MTU and state."""
    try:
        names = sorted(n for n in os.listdir(sys_class_net) if not n.startswith("."))
    except OSError:
        return {}
    out = {}
    for name in names:
        mtu = _read(os.path.join(sys_class_net, name, "mtu"))
        out[name] = {
            "mtu": int(mtu) if mtu and mtu.isdigit() else None,
            "operstate": _read(os.path.join(sys_class_net, name, "operstate")),
        }
    return out


def parse_ip_addr_json(text: str) -> dict:
    """`ip -j addr show` -> {ifname: {mtu, ipv4: [address, ...]}}."""
    out = {}
    for link in json.loads(text or "[]"):
        name = link.get("ifname")
        if not name:
            continue
        out[name] = {
            "mtu": link.get("mtu"),
            "ipv4": [a["local"] for a in link.get("addr_info", []) if a.get("family") == "inet" and "local" in a],
        }
    return out


def sysctls(names: list, proc_sys: str = "/proc/sys") -> dict:
    """net.ipv4.ip_forward -> its value as /proc/sys shows it (None when unreadable)."""
    return {n: _read(os.path.join(proc_sys, *n.split("."))) for n in names}


def ping_argv(netdev: str, ip: str, *, size: int, count: int, interval_s: float, timeout_s: int) -> list:
    """A don't-fragment ping whose payload fills the MTU (the caller passes MTU - 28), out through netdev."""
    return [
        "ping",
        "-M",
        "do",
        "-s",
        str(size),
        "-c",
        str(count),
        "-i",
        f"{interval_s:g}",
        "-W",
        str(timeout_s),
        "-I",
        netdev,
        ip,
    ]


def ping_detail(stdout: str, stderr: str) -> str:
    """The lines of a failed ping that say why (loss, message too long, unreachable, and stderr)."""
    keep = [ln.strip() for ln in stdout.splitlines() if any(w in ln for w in ("loss", "too long", "nreachable"))]
    keep += [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return "; ".join(keep)


def run_side_by_side(commands: list, deadline_s: float) -> list:
    """Start every argv at once; [(rc, stdout, stderr)] in order. One past deadline_s is killed (rc None)."""
    procs = []
    for argv in commands:
        try:
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        except OSError as exc:
            procs.append(exc)
    end = time.monotonic() + deadline_s
    results = []
    for proc in procs:
        if isinstance(proc, OSError):
            results.append((None, "", f"{proc.strerror or proc}"))
            continue
        try:
            out, err = proc.communicate(timeout=max(0.1, end - time.monotonic()))
            results.append((proc.returncode, out or "", err or ""))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            results.append((None, out or "", (err or "") + f"killed after {deadline_s:g} s"))
    return results


# The `files_wanted` option of the state modules (fabric_facts, gpu_facts, ssh_facts): what a role
# would write, so the module answers "in place or not" and the role only reads the answer.
FILES_WANTED_SPEC = {
    "type": "list",
    "elements": "dict",
    "default": [],
    "options": {
        "path": {"type": "path", "required": True},
        "kind": {"type": "str", "choices": ["file", "directory"], "default": "file"},
        "mode": {"type": "str", "required": True},
        "sha1": {"type": "str"},
    },
}


def wanted_problems(wanted: list) -> list:
    """What is wrong with a `files_wanted` list (a mode that is not octal, a sha1 that is not 40 hex digits)."""
    out = []
    for i, want in enumerate(wanted):
        try:
            int(str(want["mode"]), 8)
        except ValueError:
            out.append(f"files_wanted[{i}] ({want['path']}): mode {want['mode']!r} is not an octal mode such as '0644'")
        sha1 = want.get("sha1")
        if sha1 and (len(sha1) != 40 or any(c not in "0123456789abcdef" for c in sha1.lower())):
            out.append(
                f"files_wanted[{i}] ({want['path']}): sha1 {sha1!r} is not 40 hex digits (hash('sha1') of the content)"
            )
    return out


def stale_files(wanted: list, states: dict) -> list:
    """The paths of `wanted` not in place: missing, of another kind or mode, or (a file given its
    sha1) with other bytes. `states` is file_states() of at least those paths."""
    out = []
    for want in wanted:
        now = states.get(want["path"]) or file_state(want["path"])
        in_place = (
            now["kind"] == want.get("kind", "file")
            and now["mode"] == f"{int(str(want['mode']), 8):04o}"
            and (not want.get("sha1") or now["sha1"] == want["sha1"].lower())
        )
        if not in_place:
            out.append(want["path"])
    return out


def files_with_wanted(paths: list, wanted: list) -> list:
    """`paths` then the wanted paths not among them, in order (one read covers both)."""
    out = list(paths)
    out += [w["path"] for w in wanted if w["path"] not in out]
    return out
