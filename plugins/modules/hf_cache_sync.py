#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_cache_sync
short_description: Copy one model of a Hugging Face hub cache to other nodes over the fast link
description:
  - Runs on the node that holds the model (the source), or on one that forwards it (I(follow)).
    For each target (all targets at once) it reads the target's
    manifest over SSH, copies only what the target lacks or holds with the wrong size (or, with
    I(verify=full), the wrong content), then creates the snapshot links and refs, and checks the
    result. Nothing on a target is ever deleted.
  - The copy runs as I(streams) parallel streams, blobs split among them by size, bound to
    I(source_address) so it leaves on the fast link. Each copied file is flushed to disk before the
    links that make the snapshot complete are written.
  - Everything the module does on a target (manifest, folders, the temporary receiver, links, the
    check after the copy) runs in one SSH session per target, one connection and one C(python3).
  - I(transport=tcp) (the default) starts, in that session, a temporary receiver on each target bound
    to the target's fast-link address only, accepting only I(source_address), which must answer a
    challenge with a one-time secret (random, per run, sent over the SSH session, never logged; it never
    crosses the fast link), and drops a connection that has not answered within I(connect_timeout_s);
    it takes at most I(streams)+1 connections at a time. The source announces what it will send
    (names and sizes) and sends each file with C(sendfile(2)); the target writes only those, with
    O_DIRECT for blobs, under a temporary name, and renames it when complete. Blobs by hash name, the
    Hub's file list (C(.sparkops/<commit>.json)), C(trees/<commit>.json) and plain files in a snapshot
    can be written, blobs with mode 0444 and the others 0644 whatever the source's files have. O_DIRECT
    bypasses the page cache, which is where a copy spent its time (benchmarks/weight_sync.py), and leaves
    no cached weights behind on a Spark, whose unified memory counts them against vLLM's KV cache. On a
    filesystem without O_DIRECT it writes through the cache and drops what it wrote.
  - On a target nothing is created through a link already there (every folder on the way is opened
    without following links), and snapshot links are accepted only in huggingface_hub's form, pointing
    at C(blobs/<hash>) of the same model; whatever the source's snapshot holds, nothing is created
    outside the target's model folder.
  - I(transport=rsyncd) starts a temporary rsync daemon instead (same binding, C(hosts allow) and
    one-time password; rsync's daemon auth is a challenge-response), write-only, exporting the model's
    folder only, links munged; rsync writes through the page cache.
  - Both leave the weights unencrypted on the private fast-link cable (they are public model files);
    in exchange no CPU goes to a cipher, which measured (benchmarks/weight_sync.py, 2 cores) 1.7-2.8
    times the copy rate of I(transport=ssh). Every copied blob is hashed on the target (I(hash_copied);
    with C(tcp) as it arrives), so what arrived is checked against its name, whatever carried it. With C(tcp)
    the other files (the Hub's file lists, snapshot files) must hash to what the source announced for them
    over ssh before the copy.
  - I(transport=ssh) encrypts with I(ssh_cipher) (AES-GCM is the cheapest on the GB10's Arm cores);
    use it where the fast link is shared with machines you do not trust.
  - Before anything is copied (and, with I(follow), before each forward), every target's free space is
    checked against what the copy needs plus I(min_free_bytes_margin); the module fails naming the
    target and the figures.
  - The source must be complete first (every file of the revision as the Hub listed it at download
    time, or as C(model.safetensors.index.json) names them, and no interrupted download); the list
    files travel with the model and each target must be complete by them after the copy.
  - With I(verify=sizes) contents are not hashed (C(compared) says so); blobs that were copied are.
  - Check mode reads every manifest and returns the plan.
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  cache_dir:
    description: The hub cache on the source (C($HF_HOME/hub)).
    type: path
    required: true
  target_cache_dir:
    description: The hub cache on the targets. Defaults to I(cache_dir).
    type: path
  model:
    description: Model id, C(org/name).
    type: str
    required: true
  revision:
    description: Commit sha or ref name (C(main)) of the snapshot to copy.
    type: str
    required: true
  targets:
    description:
      - Fast-link addresses of the nodes to copy to (never their management addresses).
    type: list
    elements: str
    required: true
  source_address:
    description: This node's fast-link address; SSH and the copy connect from it.
    type: str
    required: true
  transport:
    description: How the bytes travel (see the description).
    type: str
    choices: [tcp, rsyncd, ssh]
    default: tcp
  streams:
    description: Parallel streams (connections, or rsync processes) per target; blobs are split among them by size.
    type: int
    default: 4
  verify:
    description:
      - C(sizes) compares sizes (a blob is named by its hash and never changes).
      - C(full) hashes every blob on the source and on each target first, re-copies the ones
        that do not match, and hashes what was copied.
    type: str
    choices: [sizes, full]
    default: sizes
  ssh_user:
    description: User on the targets.
    type: str
    default: root
  ssh_key:
    description: Private key for the targets (the fabric key, authorized only from the fast subnets).
    type: path
  ssh_cipher:
    description: SSH cipher for I(transport=ssh) and for the control channel.
    type: str
    default: aes128-gcm@openssh.com
  ssh_extra_args:
    description: More C(ssh) arguments, for example C(-o UserKnownHostsFile=...).
    type: list
    elements: str
    default: []
  receiver_port:
    description: TCP port of the temporary receiver on each target (I(transport=tcp) or I(transport=rsyncd)).
    type: int
    default: 8873
    aliases: [rsyncd_port]
  min_free_bytes_margin:
    description: Bytes a target must still have free after the copy.
    type: int
    default: 0
  progress_file:
    description: A JSON file rewritten every few seconds with bytes done, total and rate.
    type: path
  connect_timeout_s:
    description: SSH connect timeout.
    type: int
    default: 15
  io_timeout_s:
    description: I/O timeout of a stream (rsync's C(--timeout)); a stalled stream fails after this.
    type: int
    default: 300
  hash_copied:
    description:
      - Hash every copied blob on the target and record the match there
        (C(.sparkops/hashed-blobs.json)), so a later size check can tell a blob changed since.
      - With I(transport=tcp) the target hashes each blob from its receive buffer as it arrives and
        gives it its name only if the hash matches (no second read). With C(rsyncd) and C(ssh) it is
        hashed after the copy, which costs one read of the copied bytes on the target.
    type: bool
    default: true
  source_addresses:
    description:
      - Per target address, this node's own address on the cable it shares with that target (a ring
        node sends each way on a different cable); targets not named here use I(source_address).
        SSH and the copy bind to it and the temporary receiver accepts only it.
    type: dict
    default: {}
  follow:
    description:
      - This node is itself still receiving the model (from I(upstream)); it forwards every blob as soon
        as it is complete here (under its own name - rsync and huggingface_hub write under a temporary
        name and rename when done) and the target lacks it, until this node's snapshot is complete by
        its list files; then make the normal pass (the rest, links, refs, the check). A chain
        A to B to C so takes about one copy plus the last blob, not two copies.
      - Fails naming I(upstream) when no blob completed or grew here for I(io_timeout_s), and after
        I(follow_timeout_s) in any case. Check mode does not follow (it plans against what is here).
    type: bool
    default: false
  upstream:
    description: The node that fills this one (with I(follow)), named in messages.
    type: str
  follow_timeout_s:
    description: With I(follow), the longest this node waits for its own copy to complete.
    type: int
    default: 7200
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Reads every node's manifest over SSH and returns the plan; copies nothing.
  diff_mode:
    support: none
    details: The plan (files and bytes to copy per target) is in the result instead.
"""

EXAMPLES = r"""
- name: Sync the weights to the second Spark over the QSFP cable
  sparkops.cluster.hf_cache_sync:
    cache_dir: /var/lib/sparkops/huggingface/hub
    model: Qwen/Qwen3-235B-A22B-GPTQ-Int4
    revision: main
    targets: [192.168.100.11]
    source_address: 192.168.100.10
    transport: tcp
    streams: 8
    ssh_key: /root/.ssh/sparkops_fabric_ed25519
    ssh_extra_args: [-o, UserKnownHostsFile=/root/.ssh/sparkops_fabric_known_hosts]
    min_free_bytes_margin: 21474836480
  async: 7200
  poll: 10
"""

RETURN = r"""
revision:
  description: The commit that was synced.
  returned: always
  type: str
totals:
  description:
    - bytes_copied, files_copied, seconds (copy time - the follow, then the slowest of the targets, which
      are copied side by side) and MB_per_s (10^6 bytes/s) over all targets.
  returned: always
  type: dict
targets:
  description:
    - Per target - address, plan (missing, mismatched, hash_failed, bytes_to_copy), what was done, rate.
    - With I(transport=tcp) also C(write) (C(O_DIRECT), or buffered where the filesystem refuses it) and
      C(verified_on_receipt) (blobs hashed as they arrived).
  returned: always
  type: list
  elements: dict
compared:
  description: C(sizes) (names and sizes; contents not hashed) or C(sha256) (every blob hashed).
  returned: always
  type: str
elapsed_s:
  description: Wall time of the whole module run (manifests, copy, links, checks).
  returned: success
  type: float
followed_s:
  description: With I(follow), seconds spent forwarding while this node was still receiving.
  returned: when follow ran
  type: float
"""

import contextlib
import ipaddress
import json
import os
import secrets
import select
import shlex
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkops.cluster.plugins.module_utils import hf_cache, remote_exec

# Runs on a target: hf_cache's own source first on stdin (remote_exec.stdin_boot), then one JSON line
# per action (hf_cache.remote_main: a session, so one ssh connection and one python start per target).
REMOTE_BOOT = remote_exec.stdin_boot("remote_main", "sparkops_hf_cache_remote")
RSYNC_USER = "sparkops"
# How often a follower looks for blobs that completed since (a directory scan: cheap).
FOLLOW_POLL_S = 0.25


class SyncError(Exception):
    """A failure with a message for the user."""


class Target:
    def __init__(self, module: AnsibleModule, address: str):
        self.m = module
        self.p = module.params
        self.address = address
        self.repo = hf_cache.repo_dir(self.p["target_cache_dir"] or self.p["cache_dir"], self.p["model"])
        # This node's address on the cable to this target (a ring node has one per neighbour).
        self.source_address = (self.p.get("source_addresses") or {}).get(address) or self.p["source_address"]
        self.proc = None
        # transport=tcp: how the target wrote (O_DIRECT or not), and the blobs it hashed as they arrived.
        self.write = None
        self.verified_on_receipt: set = set()

    def ssh_argv(self) -> list:
        p = self.p
        argv = [
            "ssh",
            "-l",
            p["ssh_user"],
            "-b",
            self.source_address,
            "-c",
            p["ssh_cipher"],
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={p['connect_timeout_s']}",
            "-o",
            "ServerAliveInterval=15",
        ]
        if p["ssh_key"]:
            argv += ["-i", p["ssh_key"], "-o", "IdentitiesOnly=yes"]
        return argv + list(p["ssh_extra_args"])

    def _open(self) -> None:
        """Start this target's session: one ssh connection and one python3 for every action."""
        argv = [*self.ssh_argv(), self.address, "python3 -c " + shlex.quote(REMOTE_BOOT)]
        self.proc = hf_cache.open_pipes(argv)
        self.stderr_chunks: list = []
        self.out_buf = b""
        # Bound to this session's stream: close() drops self.proc before the reader may have run.
        stderr = self.proc.stderr
        self.stderr_reader = threading.Thread(target=lambda: self.stderr_chunks.append(stderr.read()), daemon=True)
        self.stderr_reader.start()
        with contextlib.suppress(OSError):  # a dead ssh is reported by call() with its stderr
            self.proc.stdin.write(remote_exec.stdin_preamble(hf_cache))

    def _next_result(self) -> dict | None:
        """The next RESULT line already read, else None (other lines are shell noise: dropped)."""
        while b"\n" in self.out_buf:
            line, self.out_buf = self.out_buf.split(b"\n", 1)
            text = line.decode(errors="replace")
            if text.startswith(hf_cache.RESULT_MARK):
                return json.loads(text[len(hf_cache.RESULT_MARK) :])
        return None

    def call(self, action: str, timeout: float = 3600, **args) -> dict:
        """Run ``action`` on the target in this target's session; its result, or SyncError."""
        if self.proc is None:
            self._open()
        with contextlib.suppress(OSError):
            self.proc.stdin.write(json.dumps({"action": action, **args}).encode() + b"\n")
            self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            res = self._next_result()
            if res is not None:
                if "error" in res:
                    raise SyncError(f"{self.address}: {action} failed on the node: {res['error']}")
                return res
            left = deadline - time.monotonic()
            if left <= 0:
                self.close(kill=True)
                raise SyncError(f"{self.address}: {action} over ssh did not finish in {timeout:.0f} s")
            if select.select([fd], [], [], min(left, 1.0))[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self.out_buf += chunk
        rc = self.close()
        self.stderr_reader.join(timeout=5)  # ssh has exited: its stderr ends at once
        err = b"".join(c for c in self.stderr_chunks if c).decode(errors="replace").strip()
        raise SyncError(
            f"ssh to {self.address} from {self.source_address} failed (rc {rc}): {err[-800:]}. "
            "Check that the fabric key is authorized on the target for the fast subnets "
            "(role fabric_ssh), that the target's fast link is up, and that python3 is installed there."
        )

    def close(self, kill: bool = False) -> int | None:
        """End the session: EOF stops the node's side (and any temporary daemon still running)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()
        if kill:
            proc.kill()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        return proc.returncode


def url_host(address: str) -> str:
    """An address as rsync wants it before ``:`` (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def local_address_ok(address: str) -> bool:
    """Whether ``address`` is one of this node's addresses (binding to it works)."""
    fam = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


class Progress:
    """Bytes done across the copy, written to a JSON file at most every 2 s."""

    def __init__(self, path: str | None, target: str, total: int):
        self.path, self.target, self.total = path, target, total
        self.done = 0
        self.files = 0
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.last_write = 0.0

    def add(self, size: int) -> None:
        with self.lock:
            self.done += size
            self.files += 1
            now = time.monotonic()
            if now - self.last_write >= 2.0:
                self.last_write = now
                self.write()

    def write(self, final: bool = False) -> None:
        if not self.path:
            return
        elapsed = max(time.monotonic() - self.start, 1e-6)
        state = {
            "target": self.target,
            "bytes_done": self.done,
            "bytes_total": self.total,
            "files_done": self.files,
            "MB_per_s": round(self.done / 1e6 / elapsed, 1),
            "finished": final,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        with contextlib.suppress(OSError):
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            tmp = self.path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(state, f)
            os.replace(tmp, self.path)


def rsync_common(p: dict) -> list:
    return [
        "rsync",
        "--archive",
        "--whole-file",  # no delta search: blobs are immutable, the link is faster than the CPU
        "--ignore-times",  # copy exactly the list (a same-size corrupt blob is on it)
        "--numeric-ids",
        # Each blob is on disk before it counts as copied (its hash recorded, the snapshot linked):
        # after a power cut a sizes check cannot tell a zero-filled blob from a good one. The local
        # copy the benchmark compares with pays the same (cp, then sync). rsync >= 3.2.4.
        "--fsync",
        f"--timeout={p['io_timeout_s']}",
        "--out-format=%n %l",
    ]


class Rsyncd:
    """A temporary rsync daemon on a target, started and stopped in the target's session."""

    def __init__(self, target: Target, module: AnsibleModule):
        self.t, self.m, self.p = target, module, module.params
        self.secret = secrets.token_hex(24)

    def __enter__(self):
        t, p = self.t, self.p
        try:
            t.call(
                "rsyncd_start",
                timeout=p["connect_timeout_s"] + 20,
                address=t.address,
                port=p["receiver_port"],
                path=t.repo,  # the model's folder only
                allow=t.source_address,
                user=RSYNC_USER,
                secret=self.secret,
                io_timeout=p["io_timeout_s"],
            )
        except SyncError as exc:
            raise SyncError(
                f"{t.address}: the temporary rsync daemon did not start on port {p['receiver_port']}: {exc}. "
                "Is the port free (receiver_port)? Or use transport: ssh."
            ) from exc
        return self

    def __exit__(self, *exc):
        try:
            self.t.call("rsyncd_stop", timeout=30)
        except SyncError:
            self.t.close(kill=True)  # the node stops the daemon when its session's channel closes
        return False

    def argv_env(self) -> tuple:
        p = self.p
        url = f"rsync://{RSYNC_USER}@{url_host(self.t.address)}:{p['receiver_port']}/hf/"
        env = dict(os.environ, RSYNC_PASSWORD=self.secret)
        return [*rsync_common(p), f"--address={self.t.source_address}", "./", url], env


def plan_for(target: Target, src_manifest: dict, hash_names) -> dict:
    """Read the target's manifest and what it lacks; blobs in ``hash_names`` are hashed there too."""
    probe = target.call(
        "manifest",
        timeout=7200,
        repo=target.repo,
        revision=src_manifest["revision"],
        all_blobs=True,  # a blob no link points at yet (an interrupted run) still counts
        hash={n: src_manifest["blobs"][n] for n in hash_names},
        record=not target.m.check_mode,
    )
    if target.p["transport"] != "tcp" and not probe.get("rsync"):
        raise SyncError(f"{target.address}: rsync is not installed on the target (apt-get install rsync)")
    dst = probe["manifest"]
    diff = hf_cache.diff_manifests(src_manifest, dst)
    for name in probe.get("hash_failed", []):
        if f"blobs/{name}" not in diff["copy"]:
            diff["copy"][f"blobs/{name}"] = src_manifest["blobs"][name]
            diff["bytes_to_copy"] += src_manifest["blobs"][name]
            diff["in_sync"] = False
    return {
        "address": target.address,
        "repo_path": probe["repo_path"],
        "free_bytes": probe["free_bytes"],
        "free_path": probe["free_path"],
        "missing": diff["missing"],
        "mismatched": diff["mismatched"],
        "hash_failed": probe.get("hash_failed", []),
        "copy": diff["copy"],
        "links": {**diff["links_create"], **diff["links_fix"]},
        "refs": diff["refs_update"],
        "bytes_to_copy": diff["bytes_to_copy"],
        "bytes_needed": diff["bytes_needed"],
        "in_sync": diff["in_sync"],
        "complete": bool(dst.get("complete")),
        "problems": hf_cache.completeness_problems(dst),
        "hash_record": probe.get("hash_record", {}),
    }


def gib(n: int) -> str:
    """Bytes for a message: GiB, or MiB below one GiB (so a small copy does not read as 0.0)."""
    return f"{n / 1073741824:.1f} GiB" if n >= 1073741824 else f"{n / 1048576:.1f} MiB"


class Receiver:
    """transport=tcp: a temporary receiver on a target (hf_cache.TemporaryReceiver), started and
    stopped in the target's session; :meth:`stream` sends files to it over one connection."""

    def __init__(self, target: Target, module: AnsibleModule):
        self.t, self.p = target, module.params
        self.secret = secrets.token_hex(24)
        self.channel = {
            "address": target.address,
            "port": self.p["receiver_port"],
            "source_address": target.source_address,
            "secret": self.secret,
            "io_timeout": self.p["io_timeout_s"],
        }

    def __enter__(self):
        t, p = self.t, self.p
        try:
            started = t.call(
                "tcp_start",
                timeout=p["connect_timeout_s"] + 20,
                address=t.address,
                port=p["receiver_port"],
                repo=t.repo,
                allow=t.source_address,
                secret=self.secret,
                io_timeout=p["io_timeout_s"],
                # At most one connection per stream plus one: a flood of idle connections is closed
                # at once, and one that does not answer the challenge is dropped after seconds.
                max_conns=p["streams"] + 1,
                handshake_timeout=min(p["connect_timeout_s"], p["io_timeout_s"]),
                verify=p["hash_copied"] or p["verify"] == "full",
            )
        except SyncError as exc:
            raise SyncError(
                f"{t.address}: the temporary receiver did not start on port {p['receiver_port']}: {exc}. "
                "Is the port free (receiver_port)? Or use transport: rsyncd."
            ) from exc
        self.t.write = started.get("write")
        return self

    def __exit__(self, *exc):
        try:
            stopped = self.t.call("tcp_stop", timeout=self.p["io_timeout_s"] + 30)
        except SyncError:
            self.t.close(kill=True)  # the node stops the receiver when its session's channel closes
            return False
        # Hashed on receipt and recorded there: the check after the copy need not read them again.
        self.t.verified_on_receipt.update(stopped.get("verified", []))
        return False

    def stream(self, names: list, src_repo: str, progress) -> tuple:
        return hf_cache.send_stream(self.channel, names, src_repo, progress)


def transport(stack: contextlib.ExitStack, module: AnsibleModule, target: Target):
    """A function (names, src_repo, progress) -> (rc, message) that copies files to ``target`` in one
    stream; a temporary receiver or daemon it needs lives as long as ``stack``."""
    p = module.params
    if p["transport"] == "tcp":
        return stack.enter_context(Receiver(target, module)).stream
    if p["transport"] == "rsyncd":
        daemon = stack.enter_context(Rsyncd(target, module))
        argv, env = daemon.argv_env()
    else:
        argv = [
            *rsync_common(p),
            "-e",
            shlex.join(target.ssh_argv()),
            "./",
            f"{url_host(target.address)}:{target.repo}/",
        ]
        env = None

    def rsync_stream(names: list, src_repo: str, progress) -> tuple:
        return hf_cache.run_stream(argv, env, names, src_repo, progress, timeout=4 * 3600)

    return rsync_stream


def copy_files(module: AnsibleModule, target: Target, stream, files: dict, *, src_repo: str, progress) -> float:
    """Copy ``files`` (repo-relative path -> size) in parallel streams; seconds taken, or SyncError."""
    lists = hf_cache.plan_streams(files, module.params["streams"])
    if module.params["transport"] == "tcp":
        # The receiver writes only what is announced here, with these sizes (issue 23), and the files their
        # name does not check (the Hub's lists, snapshot files) only with these hashes.
        hashes = {
            rel: hf_cache.file_sha256(os.path.join(src_repo, rel)) for rel in files if not rel.startswith("blobs/")
        }
        target.call("tcp_plan", files=files, hashes=hashes)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=len(lists)) as pool:
        futures = [pool.submit(stream, names, src_repo, progress) for names in lists]
        results = [f.result() for f in futures]
    failed = [(rc, err) for rc, err in results if rc != 0]
    if failed:
        rc, err = failed[0]
        raise SyncError(
            f"{target.address}: the copy ({module.params['transport']}) failed (rc {rc}) in {len(failed)} of "
            f"{len(lists)} stream(s): {err.strip()}. What was copied stays; run again to copy the rest."
        )
    return time.monotonic() - start


def sync_target(module: AnsibleModule, target: Target, plan: dict, src_repo: str) -> dict:
    p = module.params
    done = {"stale_temp_removed": [], "bytes_copied": 0, "files_copied": 0, "seconds": 0.0, "MB_per_s": None}
    mk = target.call("mkdirs", repo=target.repo)
    done["stale_temp_removed"] = mk.get("stale_temp_removed", [])
    if plan["copy"]:
        progress = Progress(p["progress_file"], target.address, plan["bytes_to_copy"])
        with contextlib.ExitStack() as stack:
            channel = transport(stack, module, target)
            elapsed = copy_files(module, target, channel, plan["copy"], src_repo=src_repo, progress=progress)
        progress.write(final=True)
        done.update(
            bytes_copied=plan["bytes_to_copy"],
            files_copied=len(plan["copy"]),
            seconds=round(elapsed, 2),
            MB_per_s=round(plan["bytes_to_copy"] / 1e6 / max(elapsed, 1e-6), 1),
        )
        if target.write:
            done.update(write=target.write, verified_on_receipt=len(target.verified_on_receipt))
    if plan["links"] or plan["refs"]:
        done.update(target.call("links", repo=target.repo, links=plan["links"], refs=plan["refs"]))
    return done


def local_blobs(repo: str) -> tuple:
    """(name -> size of the complete blobs here, bytes in blobs being written).

    A blob under its own name is complete: rsync writes ``.<name>.XXXXXX`` and renames it at the end,
    huggingface_hub writes ``<name>.incomplete`` and renames it; neither is a hash name.
    """
    done, partial = {}, 0
    with contextlib.suppress(FileNotFoundError), os.scandir(os.path.join(repo, "blobs")) as it:
        for entry in it:
            with contextlib.suppress(OSError):
                if not entry.is_file(follow_symlinks=False):
                    continue
                size = entry.stat(follow_symlinks=False).st_size
                if hf_cache.hash_kind(entry.name):
                    done[entry.name] = size
                else:
                    partial += size
    return done, partial


def follow_upstream(module: AnsibleModule, targets: list, src_repo: str, result: dict) -> dict:
    """Forward every blob that is complete here while the upstream is still filling this node.

    Returns target address -> names of the blobs forwarded. Ends when this node's snapshot is complete
    by its list files (the final pass then copies the rest, links, refs and checks); SyncError when
    nothing new arrived for ``io_timeout_s`` (the upstream stalled or died) or after ``follow_timeout_s``.
    """
    p = module.params
    upstream = p["upstream"] or "the upstream node"
    started = time.monotonic()
    have: dict = {}
    for t in targets:
        t.call("mkdirs", repo=t.repo)
        probe = t.call("manifest", timeout=600, repo=t.repo, revision=p["revision"], all_blobs=True, record=False)
        have[t.address] = {n: s for n, s in probe["manifest"]["blobs"].items() if hf_cache.hash_kind(n)}
    sent: dict = {t.address: [] for t in targets}
    totals = result["totals"]
    with contextlib.ExitStack() as stack:
        channels = {t.address: transport(stack, module, t) for t in targets}
        progress = {t.address: Progress(p["progress_file"], t.address, 0) for t in targets}
        last_seen, last_change = None, time.monotonic()
        while True:
            mine = hf_cache.build_manifest(src_repo, p["revision"])
            ready, partial = local_blobs(src_repo)
            if mine["revision_found"] and mine["complete"]:
                break
            now = time.monotonic()
            if (ready, partial) != last_seen:
                last_seen, last_change = (ready, partial), now
            elif now - last_change > p["io_timeout_s"]:
                raise SyncError(
                    f"{upstream} sent nothing for {p['io_timeout_s']} s (no blob completed or grew in "
                    f"{src_repo}/blobs; {len(ready)} complete so far): the copy from {upstream} to this node "
                    "stalled or failed - see that node's sync. What arrived stays; run again to resume."
                )
            if now - started > p["follow_timeout_s"]:
                raise SyncError(
                    f"this node's copy from {upstream} was not complete after follow_timeout_s="
                    f"{p['follow_timeout_s']} s ({len(ready)} blob(s) here): "
                    + "; ".join(hf_cache.completeness_problems(mine))
                )
            todo = {
                t: {f"blobs/{n}": s for n, s in ready.items() if have[t.address].get(n) != s}
                for t in targets
                if any(have[t.address].get(n) != s for n, s in ready.items())
            }
            if not todo:
                time.sleep(FOLLOW_POLL_S)
                continue
            for t, files in todo.items():
                # Free space first, as the final pass does: a full disk is a clear error, not a failed write.
                free = t.call("free", repo=t.repo)
                need = sum(files.values())
                if free["free_bytes"] - need < p["min_free_bytes_margin"]:
                    raise SyncError(
                        f"not enough space on {t.address} to forward what arrived, nothing more was copied: it "
                        f"needs {gib(need)} plus {gib(p['min_free_bytes_margin'])} margin but has "
                        f"{gib(free['free_bytes'])} free on {free['free_path']}. Free space or lower "
                        "weight_cache_min_free_gib."
                    )

            def forward(t: Target, files: dict) -> float:
                return copy_files(
                    module, t, channels[t.address], files, src_repo=src_repo, progress=progress[t.address]
                )

            with ThreadPoolExecutor(max_workers=len(todo)) as pool:
                futures = {t: pool.submit(forward, t, files) for t, files in todo.items()}
                for t, fut in futures.items():
                    fut.result()  # SyncError: the first failure ends the follow
                    files = todo[t]
                    names = [path.removeprefix("blobs/") for path in files]
                    have[t.address].update({n: ready[n] for n in names})
                    sent[t.address].extend(names)
                    totals["bytes_copied"] += sum(files.values())
                    totals["files_copied"] += len(files)
    result["followed_s"] = round(time.monotonic() - started, 2)
    return sent


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "cache_dir": {"type": "path", "required": True},
            "target_cache_dir": {"type": "path"},
            "model": {"type": "str", "required": True},
            "revision": {"type": "str", "required": True},
            "targets": {"type": "list", "elements": "str", "required": True},
            "source_address": {"type": "str", "required": True},
            "transport": {"type": "str", "choices": ["tcp", "rsyncd", "ssh"], "default": "tcp"},
            "streams": {"type": "int", "default": 4},
            "verify": {"type": "str", "choices": ["sizes", "full"], "default": "sizes"},
            "ssh_user": {"type": "str", "default": "root"},
            "ssh_key": {"type": "path"},
            "ssh_cipher": {"type": "str", "default": "aes128-gcm@openssh.com"},
            "ssh_extra_args": {"type": "list", "elements": "str", "default": []},
            "receiver_port": {"type": "int", "default": 8873, "aliases": ["rsyncd_port"]},
            "min_free_bytes_margin": {"type": "int", "default": 0},
            "progress_file": {"type": "path"},
            "connect_timeout_s": {"type": "int", "default": 15},
            "io_timeout_s": {"type": "int", "default": 300},
            "hash_copied": {"type": "bool", "default": True},
            "source_addresses": {"type": "dict", "default": {}},
            "follow": {"type": "bool", "default": False},
            "upstream": {"type": "str"},
            "follow_timeout_s": {"type": "int", "default": 7200},
        },
        supports_check_mode=True,
    )
    targets: list = []
    try:
        sync(module, targets)
    finally:
        for target in targets:  # on success and on fail_json alike: no session (or daemon) outlives us
            target.close()


def sync(module: AnsibleModule, targets: list) -> None:
    """The module's work; ``targets`` collects the Target objects so that main() closes their sessions."""
    p = module.params
    started = time.monotonic()
    result = {
        "changed": False,
        "revision": None,
        "targets": [],
        "totals": {},
        "compared": "sha256" if p["verify"] == "full" else "sizes",
    }

    def fail(msg: str) -> None:
        module.fail_json(msg=msg, **result)

    # ---- arguments
    if not 1 <= p["streams"] <= 64:
        fail(f"streams={p['streams']}: use 1 to 64 parallel streams")
    if not 1 <= p["receiver_port"] <= 65535:
        fail(f"receiver_port={p['receiver_port']} is not a TCP port")
    if p["min_free_bytes_margin"] < 0:
        fail("min_free_bytes_margin must be >= 0")
    p["source_addresses"] = {str(k): str(v) for k, v in (p["source_addresses"] or {}).items()}
    for addr in [p["source_address"], *p["targets"], *p["source_addresses"], *p["source_addresses"].values()]:
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            fail(f"{addr!r} is not an IP address: give the nodes' fast-link addresses (sparkops_fast_links)")
    if p["source_address"] in p["targets"] or set(p["source_addresses"].values()) & set(p["targets"]):
        fail(f"an address of this node is among the targets {p['targets']}: list only the other nodes")
    if set(p["source_addresses"]) - set(p["targets"]):
        fail(f"source_addresses names {sorted(set(p['source_addresses']) - set(p['targets']))}, not among the targets")
    if p["follow_timeout_s"] < 1 or p["io_timeout_s"] < 1:
        fail("follow_timeout_s and io_timeout_s must be at least 1 (seconds)")
    if len(set(p["targets"])) != len(p["targets"]):
        fail(f"targets has duplicates: {p['targets']}")
    for own in sorted({p["source_address"], *p["source_addresses"].values()}):
        if not local_address_ok(own):
            fail(
                f"source address {own} is not an address of this node: the sync must leave on "
                "this node's fast link. Check sparkops_fast_links and that the link is configured (roce_network)."
            )
    if p["ssh_key"] and not os.path.isfile(p["ssh_key"]):
        fail(f"ssh_key {p['ssh_key']} does not exist on this node (run the fabric_ssh role first)")
    try:
        src_repo = hf_cache.repo_dir(p["cache_dir"], p["model"])
        targets.extend(Target(module, a) for a in p["targets"])
    except ValueError as exc:
        fail(str(exc))

    result["totals"] = {"bytes_to_copy": 0, "bytes_copied": 0, "files_copied": 0, "seconds": 0.0}
    forwarded: dict = {t.address: [] for t in targets}
    if p["follow"] and not module.check_mode:
        # ---- forward what has arrived while the upstream still fills this node
        follow_start = time.monotonic()
        try:
            forwarded = follow_upstream(module, targets, src_repo, result)
        except SyncError as exc:
            fail(str(exc))
        result["totals"]["seconds"] = round(time.monotonic() - follow_start, 2)

    # ---- the source must be complete (and, with verify=full, correct)
    src = hf_cache.build_manifest(src_repo, p["revision"])
    result["revision"] = src["revision"]
    if not src["revision_found"]:
        fail(f"{p['model']}@{p['revision']} is not in {p['cache_dir']} on this node: download it first")
    if not src["complete"]:
        fail(
            f"{p['model']}@{p['revision']} is incomplete on the source, nothing was copied: "
            + "; ".join(hf_cache.completeness_problems(src))
            + ". Download it again (weight_cache_source: hub resumes an interrupted download) before syncing."
        )
    if p["verify"] == "full":
        bad = hf_cache.verify_and_record(src_repo, list(src["blobs"]))
        if bad:
            fail(
                f"{len(bad)} blob(s) on the source do not match their hash ({', '.join(bad[:3])}): "
                "delete them and download again; nothing was copied"
            )

    # ---- plan every target, check space everywhere before copying anywhere
    try:
        plans = [plan_for(t, src, src["blobs"] if p["verify"] == "full" else ()) for t in targets]
    except SyncError as exc:
        fail(str(exc))
    short = []
    for plan in plans:
        # A target with nothing to copy is not refused for a disk that filled up since.
        if plan["bytes_needed"] > 0 and plan["free_bytes"] - plan["bytes_needed"] < p["min_free_bytes_margin"]:
            short.append(
                f"{plan['address']} needs {gib(plan['bytes_needed'])} for the copy plus "
                f"{gib(p['min_free_bytes_margin'])} margin but has {gib(plan['free_bytes'])} free "
                f"on {plan['free_path']}"
            )
    result["targets"] = [
        {k: v for k, v in plan.items() if k not in ("copy", "links")}
        | {"files_to_copy": len(plan["copy"]), "links_to_write": len(plan["links"])}
        for plan in plans
    ]
    if short:
        fail(
            "not enough space, nothing was copied: "
            + "; ".join(short)
            + ". Free space or lower weight_cache_min_free_gib."
        )
    result["changed"] = not all(plan["in_sync"] for plan in plans) or result["totals"]["files_copied"] > 0
    result["totals"]["bytes_to_copy"] = sum(plan["bytes_to_copy"] for plan in plans)
    if module.check_mode or all(plan["in_sync"] for plan in plans):
        finish(module, result, started)

    # ---- copy to every target at once (each on its own cable), then check each
    def one(plan: dict, target: Target) -> dict:
        done = sync_target(module, target, plan, src_repo)
        # Sizes of everything again, and the hash of what was just copied or forwarded (recorded on the
        # target, so later checks there need not read it again): the other blobs were hashed by the plan
        # a moment ago (verify=full) or were there before.
        copied = [path.removeprefix("blobs/") for path in plan["copy"] if path.startswith("blobs/")]
        copied += forwarded[target.address]
        copied = [name for name in copied if name not in target.verified_on_receipt]
        after = plan_for(target, src, copied if p["verify"] == "full" or p["hash_copied"] else ())
        if not after["in_sync"] or not after["complete"]:
            raise SyncError(
                f"{target.address}: after the copy the target still differs from the source "
                f"(missing {after['missing'][:3]}, wrong size {after['mismatched'][:3]}, "
                f"wrong hash {after['hash_failed'][:3]}; {'; '.join(after['problems']) or 'complete'}). "
                "Check the target's disk and run again."
            )
        return done

    work = [w for w in zip(plans, targets, result["targets"], strict=True) if not w[0]["in_sync"]]
    errors, seconds = [], [0.0]
    with ThreadPoolExecutor(max_workers=len(work)) as pool:
        futures = [(pool.submit(one, plan, t), summary) for plan, t, summary in work]
        for fut, summary in futures:
            try:
                done = fut.result()
            except SyncError as exc:
                errors.append(str(exc))
                continue
            summary.update(done)
            seconds.append(done["seconds"])
            result["totals"]["bytes_copied"] += done["bytes_copied"]
            result["totals"]["files_copied"] += done["files_copied"]
    if errors:
        fail("; ".join(errors))
    # The copies ran side by side: the slowest is the copy time (after the follow, if any).
    result["totals"]["seconds"] = round(result["totals"]["seconds"] + max(seconds), 2)
    finish(module, result, started)


def finish(module: AnsibleModule, result: dict, started: float) -> None:
    totals = result["totals"]
    seconds = totals.get("seconds") or 0.0
    totals["MB_per_s"] = (
        round(totals["bytes_copied"] / 1e6 / seconds, 1) if totals["bytes_copied"] and seconds else None
    )
    result["elapsed_s"] = round(time.monotonic() - started, 2)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
