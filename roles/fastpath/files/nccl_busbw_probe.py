"""All_gather bus bandwidth across the nodes, over NCCL, with the deployment's NCCL environment.

Runs INSIDE the serving image (its torch and NCCL), one process per node on that node's GPU:

    MASTER_ADDR=<head fast-link address> MASTER_PORT=29511 WORLD_SIZE=2 RANK=<0|1> \
        python3 nccl_busbw_probe.py --min-bytes 1M --max-bytes 1G

or on one host with several GPUs: ``python3 nccl_busbw_probe.py --spawn 2``. Rank 0 prints nccl-tests'
all_gather table (out-of-place columns), so plugins/module_utils/nccl_busbw.py reads either:
``size`` is the gathered bytes S (every rank's part), ``algbw = S / t``, ``busbw = algbw * (n - 1) / n``
(nccl-tests' PERFORMANCE.md). ``#wrong`` counts gathered elements that differ from what their rank sent.
"""

from __future__ import annotations

import argparse
import os
import sys

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size_arg(text: str) -> int:
    text = text.strip().upper().rstrip("B")
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * UNITS[unit])


def run(rank: int, world: int, local_rank: int, args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415 - only the image has it
    import torch.distributed as dist  # noqa: PLC0415

    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", local_rank))
    elem = 4  # float32
    size, rows = args.min_bytes, []
    while size <= args.max_bytes:
        count = max(1, size // (elem * world))
        send = torch.full((count,), float(rank + 1), dtype=torch.float32, device="cuda")
        recv = torch.empty(count * world, dtype=torch.float32, device="cuda")
        for _warmup in range(args.warmup):
            dist.all_gather_into_tensor(recv, send)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _timed in range(args.iters):
            dist.all_gather_into_tensor(recv, send)
        end.record()
        torch.cuda.synchronize()
        seconds = start.elapsed_time(end) / 1000 / args.iters
        expect = torch.arange(1, world + 1, dtype=torch.float32, device="cuda").repeat_interleave(count)
        wrong = torch.tensor([int((recv != expect).sum().item())], device="cuda")
        dist.all_reduce(wrong)
        gathered = count * world * elem
        algbw = gathered / seconds / 1e9
        rows.append((gathered, count * world, seconds * 1e6, algbw, algbw * (world - 1) / world, int(wrong.item())))
        size *= 2
    if rank == 0:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
        env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("NCCL_") and " " not in v)
        print(
            f"# sparkops nccl_busbw_probe: op=all_gather world_size={world} torch={torch.__version__} nccl={nccl} "
            f"device={torch.cuda.get_device_name(local_rank).replace(' ', '_')} {env}".rstrip()
        )
        print("#       size         count      type   redop    root     time   algbw   busbw #wrong")
        print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)")
        for gathered, elems, us, alg, bus, bad in rows:
            print(f"{gathered:12d}  {elems:12d}     float    none      -1  {us:7.1f}  {alg:6.2f}  {bus:6.2f}  {bad:5d}")
        print(f"# Avg bus bandwidth    : {sum(r[4] for r in rows) / len(rows):.4f}")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def spawned(local_rank: int, world: int, args: argparse.Namespace) -> None:
    run(local_rank, world, local_rank, args)


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-bytes", type=size_arg, default=size_arg("1M"))
    ap.add_argument("--max-bytes", type=size_arg, default=size_arg("1G"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--spawn", type=int, default=0, help="start this many ranks on this host's GPUs")
    args = ap.parse_args(argv)
    if args.spawn:
        import torch.multiprocessing as mp  # noqa: PLC0415

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        mp.spawn(spawned, args=(args.spawn, args), nprocs=args.spawn, join=True)
        return 0
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    return run(rank, world, int(os.environ.get("LOCAL_RANK", "0")), args)


if __name__ == "__main__":
    raise SystemExit(main())
