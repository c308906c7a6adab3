#!/usr/bin/env python3
"""Does a second start reuse the compile caches that sparkops keeps on the host? Measured in one run.

Each "start" is a FRESH Python process laid out like a sparkops serving container: its HOME holds the
folders that ``sparkops_container_volumes`` mounts (/root/.cache/vllm, /root/.triton, ...), here
symbolic links to one persisted "host" folder per mount, and its TMPDIR (the container's /tmp) is new
and empty at every start, as in a new container. Each process torch.compiles the same small
transformer block (RMSNorm, QKV and output matmuls, softmax attention, SiLU-gated MLP; Inductor's
default mode, whose norm, softmax and activation become Triton kernels) on the GPU, times the
compile and first call, then launches a Triton kernel of its own (as vLLM's Triton attention does)
and times its first launch. Per start it prints those seconds, torch's compile-cache counters and how
many files appeared under each folder.

Every process first does what vllm/env_override.py does on importing vLLM 0.19.0
(TORCHINDUCTOR_COMPILE_THREADS=1, so Inductor compiles in the process; TRITON_CACHE_AUTOTUNING=1).
Scenarios (vLLM 0.19.0's two Inductor paths, tests/fixtures/vllm/cache_paths-0.19.0.json):

* ``vllm-default``: VLLM_USE_STANDALONE_COMPILE=1, the default. The graph is compiled with
  ``torch._inductor.standalone_compile`` and saved (format "binary") under VLLM_CACHE_ROOT
  (``~/.cache/vllm/torch_compile_cache/<hash>/rank_0_0/backbone/``); a start that finds it loads it.
  vLLM sets no TORCHINDUCTOR_CACHE_DIR on this path: Inductor's own cache is torch's default,
  ``$TMPDIR/torchinductor_<user>``, and when Inductor builds a Triton kernel it points
  TRITON_CACHE_DIR of the whole process into it. Starts: cold (empty folders), warm (same host
  folders, new /tmp), warm again; and last the CONTROL, the same with empty folders again.
* the same with ``sparkops_container_cache_env`` (TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR on
  mounted folders, as sparkops now sets them in the containers): cold, warm.
* ``inductor-adaptor``: VLLM_USE_STANDALONE_COMPILE=0. vLLM sets TORCHINDUCTOR_CACHE_DIR and
  TRITON_CACHE_DIR to ``inductor_cache`` and ``triton_cache`` next to its graphs, and torch.compile's
  own FX graph cache does the reuse: cold, warm.

What is not reproduced: vLLM itself (not installed on the GPU machine), its AOT-compile artefact
(``torch_aot_compile/``, VLLM_USE_AOT_COMPILE with torch >= 2.10), CUDA graphs, FlashInfer.

    python benchmarks/compile_cache_reuse.py [--keep DIR]

Without a CUDA GPU (or without torch) it says so and exits 0: Inductor on a CPU makes C++, not the
Triton kernels this is about, so a CPU run would measure something else.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import torch
except ImportError:  # the test machines have no torch: main() says so
    torch = None
try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None

# Container paths of the cache mounts in roles/sparkops_defaults/defaults/main/cluster.yml
# (sparkops_container_volumes), by host folder name under sparkops_cache_dir.
# tests/unit/test_cache_mounts.py checks that this matches the YAML.
SPARKOPS_CACHE_MOUNTS = {
    "vllm": "/root/.cache/vllm",
    "flashinfer": "/root/.cache/flashinfer",
    "triton": "/root/.triton",
    "torch": "/root/.cache/torch",
    "nv": "/root/.nv",
}
# sparkops_container_cache_env in the same file: pins Triton's and Inductor's caches to mounted folders
# (without it Inductor moves TRITON_CACHE_DIR into the container's /tmp, see the module docstring).
SPARKOPS_CACHE_ENV = {
    "TRITON_CACHE_DIR": "/root/.triton/cache",
    "TORCHINDUCTOR_CACHE_DIR": "/root/.cache/torch/inductor",
    "HF_MODULES_CACHE": "/root/.cache/vllm/hf_modules",
}
DIM, HIDDEN, TOKENS = 1024, 4096, 512
RESULT = "RESULT "

if triton is not None:

    @triton.jit
    def _scale_add(x_ptr, y_ptr, n, block: tl.constexpr):
        offs = tl.program_id(0) * block + tl.arange(0, block)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


def _block(x, w):
    """One decoder layer's shape of work: norm, attention, norm, gated MLP (bf16)."""
    h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w["n1"]
    q, k, v = (h @ w["qkv"]).split(DIM, dim=-1)
    att = torch.softmax((q @ k.transpose(0, 1)).float() / DIM**0.5, dim=-1).to(x.dtype)
    x = x + (att @ v) @ w["o"]
    h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w["n2"]
    gate, up = (h @ w["gu"]).split(HIDDEN, dim=-1)
    return x + (torch.nn.functional.silu(gate) * up) @ w["down"]


def _files(root):
    return {str(p) for p in Path(root).rglob("*") if p.is_file()} if Path(root).exists() else set()


def _standalone_backend(artifact_dir, log):
    """vLLM 0.19.0's default path in small: compile once, save the artefact, load it on a later start."""

    def backend(gm, example_inputs):
        key = hashlib.sha256((gm.code + repr([(t.shape, t.dtype) for t in example_inputs])).encode()).hexdigest()
        path = os.path.join(artifact_dir, "artifact_" + key[:16])
        if os.path.exists(path):
            log["artifact"] = "loaded"
            return torch._inductor.CompiledArtifact.load(path=path, format="binary")
        compiled = torch._inductor.standalone_compile(gm, example_inputs, dynamic_shapes="from_graph")
        compiled.save(path=path, format="binary")
        log["artifact"] = "compiled and saved"
        return compiled

    return backend


def child(scenario):
    """One start: runs inside the fresh process."""
    # What every vLLM 0.19.0 process does on import (vllm/env_override.py): Inductor compiles in-process.
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    torch._inductor.config.compile_threads = 1
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    vllm_root = os.path.expanduser("~/.cache/vllm")  # VLLM_CACHE_ROOT's default (vllm/envs.py)
    cache_dir = os.path.join(vllm_root, "torch_compile_cache", "samecfg0001", "rank_0_0")
    log = {"artifact": None}
    if scenario == "inductor-adaptor":  # what InductorAdaptor.initialize_cache does in vLLM 0.19.0
        for var, name in (("TORCHINDUCTOR_CACHE_DIR", "inductor_cache"), ("TRITON_CACHE_DIR", "triton_cache")):
            os.makedirs(os.path.join(cache_dir, name), exist_ok=True)
            os.environ[var] = os.path.join(cache_dir, name)
        backend = "inductor"
    else:
        os.makedirs(os.path.join(cache_dir, "backbone"), exist_ok=True)
        backend = _standalone_backend(os.path.join(cache_dir, "backbone"), log)
    gen = torch.Generator(device="cuda").manual_seed(0)
    shapes = {"n1": (DIM,), "n2": (DIM,), "qkv": (DIM, 3 * DIM), "o": (DIM, DIM)}
    shapes.update({"gu": (DIM, 2 * HIDDEN), "down": (HIDDEN, DIM)})
    w = {k: torch.randn(s, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02 for k, s in shapes.items()}
    x = torch.randn(TOKENS, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    events = []  # Triton compiles seen in this process (Inductor may compile in worker processes too)
    try:
        triton.knobs.compilation.listener = lambda **kw: events.append(bool(kw.get("cache_hit")))
    except AttributeError:  # older Triton: the file counts still tell
        events = None
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = torch.compile(_block, backend=backend, dynamic=False)(x, w)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    err = (out.float() - _block(x, w).float()).abs().max().item()
    triton_env = os.environ.get("TRITON_CACHE_DIR")  # set by Inductor itself if vLLM did not
    seen = None if events is None else len(events)
    block = "unknown" if events is None else {"miss": events.count(False), "hit": events.count(True)}
    y = torch.empty_like(x)
    start = time.perf_counter()
    _scale_add[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), block=1024)
    torch.cuda.synchronize()
    kernel = {"first_launch_s": round(time.perf_counter() - start, 3)}
    kernel["triton_cache_hit"] = "unknown" if events is None else events[seen:]
    from torch._dynamo.utils import counters  # noqa: PLC0415  (torch is optional at import time)

    keep = ("cache", "bundler", "compile")
    ctr = {
        f"{c}.{k}": v for c in ("inductor", "aot_autograd") for k, v in counters[c].items() if any(s in k for s in keep)
    }
    print(
        RESULT
        + json.dumps(
            {
                "compile_first_call_s": round(compile_s, 3),
                "max_abs_err": err,
                "counters": ctr,
                "artifact": log["artifact"],
                "triton_compiles_in_process": block,
                "inductor_compile_threads": torch._inductor.config.compile_threads,
                "triton_cache_dir_at_kernel": triton_env,
                "own_triton_kernel": kernel,
            }
        )
    )


def start(root, label, scenario, cache_env=None):
    """Start a fresh process in a new 'container' whose mounts point at the persisted host folders."""
    ctr = Path(root) / "containers" / label
    home, tmp = ctr / "root", ctr / "tmp"
    tmp.mkdir(parents=True)
    home.mkdir(parents=True, exist_ok=True)
    for name, inside in SPARKOPS_CACHE_MOUNTS.items():
        host = Path(root) / "host" / name
        host.mkdir(parents=True, exist_ok=True)
        link = ctr / inside.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(host, target_is_directory=True)
    watched = {f"host:{n}": Path(root) / "host" / n for n in SPARKOPS_CACHE_MOUNTS}
    watched["container:/tmp (not persisted)"] = tmp
    before = {k: _files(p) for k, p in watched.items()}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_", "VLLM_", "XDG_"))}
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONUNBUFFERED="1", BENCH_CHILD=scenario)
    env.update({k: str(ctr) + v for k, v in (cache_env or {}).items()})  # container path -> this layout
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=400, check=False)
    wall = time.perf_counter() - began
    lines = [x for x in proc.stdout.splitlines() if x.startswith(RESULT)]
    if proc.returncode or not lines:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
        raise SystemExit(f"start {label} failed (rc {proc.returncode})")
    res = json.loads(lines[-1][len(RESULT) :])
    res["process_wall_s"] = round(wall, 2)
    new = {k: sorted(_files(p) - before[k]) for k, p in watched.items()}
    res["new_files"] = {k: f"{len(v)} ({sum(f.endswith('.cubin') for f in v)} .cubin)" for k, v in new.items() if v}
    print(f"--- start {label} [{scenario}; container env: {cache_env or 'none'}]")
    for key, value in res.items():
        print(f"    {key}: {json.dumps(value) if isinstance(value, dict) else value}")
    return res


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="lay the folders out here and keep them (default: a temporary folder)")
    args = parser.parse_args()
    if torch is None or triton is None or not torch.cuda.is_available():
        print("compile_cache_reuse: no CUDA GPU here (or no torch/triton): nothing measured. Run it on a GPU.")
        return 0
    smi = shutil.which("nvidia-smi")
    driver = (
        subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if smi
        else "unknown (no nvidia-smi)"
    )
    print(
        f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}, "
        f"GPU {torch.cuda.get_device_name(0)}, driver {driver}, CPU cores {os.cpu_count()} "
        f"(usable {len(os.sched_getaffinity(0))}), python {sys.version.split()[0]}"
    )
    root = args.keep or tempfile.mkdtemp(prefix="compile-cache-")
    print(f"folders under {root}")
    plan = (  # (folder, label, scenario, container env); each folder starts empty
        ("a", "1-cold", "vllm-default", None),
        ("a", "2-warm", "vllm-default", None),
        ("a", "3-warm-again", "vllm-default", None),
        ("b", "4-cold", "vllm-default", SPARKOPS_CACHE_ENV),
        ("b", "5-warm", "vllm-default", SPARKOPS_CACHE_ENV),
        ("c", "6-cold", "inductor-adaptor", None),
        ("c", "7-warm", "inductor-adaptor", None),
        ("d", "8-control", "vllm-default", None),
    )
    r = {label: start(f"{root}/{folder}", label, scenario, env) for folder, label, scenario, env in plan}
    control = r["8-control"]["compile_first_call_s"]
    print("=== summary: compile + first call of the block in seconds; own Triton kernel: first launch, cache hit")
    for label, res in r.items():
        sec, kern = res["compile_first_call_s"], res["own_triton_kernel"]
        fx = {k.split(".")[1]: v for k, v in res["counters"].items() if k.startswith("inductor.fxgraph_cache")}
        print(
            f"{label:13} {sec:7.2f} s, ratio to control {sec / control:.3f}; graph: {res['artifact'] or fx};"
            f" own kernel {kern['first_launch_s']:.3f} s, cache hit {kern['triton_cache_hit']}"
        )
    for cold, warm, name in (
        ("1-cold", "2-warm", "vllm-default, no cache env"),
        ("4-cold", "5-warm", "vllm-default + sparkops_container_cache_env"),
        ("6-cold", "7-warm", "inductor-adaptor (VLLM_USE_STANDALONE_COMPILE=0)"),
    ):
        w, c = r[warm]["compile_first_call_s"], r[cold]["compile_first_call_s"]
        print(f"{name}: warm/cold {w / c:.3f}, warm/control {w / control:.3f}")
    return 0


if __name__ == "__main__":
    if os.environ.get("BENCH_CHILD"):
        child(os.environ["BENCH_CHILD"])
    else:
        sys.exit(main())
