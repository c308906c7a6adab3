#!/usr/bin/env python3
"""Weight-sync benchmark: hf_cache_sync against the community's single `rsync -a` over ssh, in one run.

Both copy the same synthetic Hugging Face cache (``--gib``, in ``--shards`` blobs) from 127.0.0.1 to a
throw-away sshd on 127.0.0.2 (loopback only: nothing leaves this machine), into a fresh target each
time, and the script prints MB/s for each and the ratio to the baseline, with the core count, since on
loopback the CPU (ssh encryption, rsync's checksums) is the limit, as it is on a Spark's 200 Gb/s link.

    .venv/bin/python benchmarks/weight_sync.py --gib 2 --streams 4

Needs root (the sshd), ssh, sshd and rsync. Bounded: one pass per variant, each under --timeout-s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "collections"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from hf_cache_helpers import MODEL, LoopbackSshd, free_port, make_model, sshd_available  # noqa: E402
from module_runner import run_module  # noqa: E402

from ansible_collections.sparkops.cluster.plugins.modules import hf_cache_sync  # noqa: E402


def baseline(sshd: LoopbackSshd, src: Path, dst: Path, timeout: float) -> float:
    """What the community guides do: one `rsync -a` of the cache over ssh with default settings."""
    dst.mkdir(parents=True, exist_ok=True)
    ssh = (
        f"ssh -i {sshd.key} -p {sshd.port} -b 127.0.0.1 -o BatchMode=yes "
        f"-o UserKnownHostsFile={sshd.known_hosts} -o StrictHostKeyChecking=yes"
    )
    t0 = time.monotonic()
    subprocess.run(
        ["rsync", "-a", "-e", ssh, f"{src}/", f"root@{sshd.address}:{dst}/"], check=True, timeout=timeout
    )
    return time.monotonic() - t0


def ours(sshd: LoopbackSshd, src: Path, dst: Path, transport: str, streams: int) -> tuple:
    dst.mkdir(parents=True, exist_ok=True)
    args = {
        "cache_dir": str(src),
        "target_cache_dir": str(dst),
        "model": MODEL,
        "revision": "main",
        "streams": streams,
        "transport": transport,
        "rsyncd_port": free_port(),
        **sshd.module_args(),
    }
    t0 = time.monotonic()
    res = run_module(hf_cache_sync, args)
    elapsed = time.monotonic() - t0
    if res.get("failed"):
        raise SystemExit(f"hf_cache_sync failed: {res['msg']}")
    return elapsed, res["totals"]["bytes_copied"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="size of the synthetic model (GiB)")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--streams", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--timeout-s", type=float, default=600)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    reason = sshd_available()
    if reason:
        raise SystemExit(f"weight_sync benchmark: {reason}")
    with tempfile.TemporaryDirectory(prefix="sparkops-bench-") as tmp:
        work = Path(tmp)
        (work / "ssh").mkdir()
        sshd = LoopbackSshd(work / "ssh").start()
        try:
            shard_bytes = int(args.gib * (1 << 30) / args.shards)
            make_model(work / "src", shards=args.shards, shard_bytes=shard_bytes)
            total = sum(f.stat().st_size for f in (work / "src").rglob("*") if f.is_file() and not f.is_symlink())
            rows = []
            t = baseline(sshd, work / "src", work / "dst-baseline", args.timeout_s)
            rows.append(("rsync -a over ssh, 1 stream (community baseline)", t, total))
            shutil.rmtree(work / "dst-baseline")
            for transport in ("ssh", "rsyncd"):
                dst = work / f"dst-{transport}"
                t, copied = ours(sshd, work / "src", dst, transport, args.streams)
                rows.append((f"hf_cache_sync transport={transport}, {args.streams} streams", t, copied))
                shutil.rmtree(dst)
        finally:
            sshd.stop()
    base_rate = rows[0][2] / rows[0][1]
    print(f"weight sync, {total / 1e9:.2f} GB in {args.shards} blobs, loopback, {os.cpu_count()} cores")
    out = []
    for name, secs, nbytes in rows:
        rate = nbytes / secs
        print(f"  {name:<55} {secs:7.2f} s  {rate / 1e6:8.1f} MB/s  x{rate / base_rate:.2f}")
        out.append({"variant": name, "seconds": round(secs, 3), "bytes": nbytes, "MB_per_s": round(rate / 1e6, 1),
                    "ratio_to_baseline": round(rate / base_rate, 2)})
    if args.json:
        args.json.write_text(json.dumps({"cores": os.cpu_count(), "bytes": total, "rows": out}, indent=2) + "\n")


if __name__ == "__main__":
    main()
