"""TEST DOUBLE for vLLM's `vllm serve`: used ONLY in the sparkops simulated cluster. It is NOT vLLM.

It is installed as `vllm` in the stand-in image so the serving role can be run end to end on
machines without GPUs. What it proves, when a deployment passes against it:
  - the role passes flags real vLLM accepts (real flag names; unknown flags and bad values exit 2
    with an argparse error, like vLLM);
  - the model's weights are where the Hugging Face cache layout says (HF_HUB_CACHE, HF_HOME/hub or
    --download-dir; models--org--name/snapshots/<rev>/ with config.json, a weight file and every
    shard named by an index; --revision honoured); otherwise it refuses to start;
  - with --distributed-executor-backend ray (or TP*PP > 1 without a backend) the Ray cluster really
    has TP*PP GPUs on distinct nodes: it places a STRICT_SPREAD placement group of {"GPU": 1}
    bundles, holds one GPU actor per bundle, and only then listens (like vLLM, which listens once
    its engine is up); a node holding a bundle that dies turns /health and completions into 500s;
  - the API surface a client sees: /health, /v1/models, /v1/chat/completions, /v1/completions
    (SSE streaming with stream_options.include_usage, non-streaming with usage), /metrics with
    vLLM's metric names, Bearer-key checks on /v1/* only; tokens paced at SPARKOPS_TEST_DOUBLE_TOK_S
    per request (default 40) and prefix-cache hits counted per 16-token block.
What it CANNOT prove: anything about GPUs, CUDA, NCCL/RDMA, model quality or real speed, memory
fit (--gpu-memory-utilization, --max-model-len are only range-checked), quantization or attention
backends actually working, or that real vLLM's defaults match. Its "tokens" are words.
Only the standard library and `ray` are used. Logs go to stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

VERSION = os.environ.get("SPARKOPS_TEST_DOUBLE_VERSION", "0.0.0+sparkops.test.double")
BLOCK = 16
QUANT = (  # noqa: SIM905 - one word per choice, kept compact
    "aqlm awq awq_marlin bitblas bitsandbytes compressed-tensors deepspeedfp experts_int8 fbgemm_fp8 "
    "fp8 gguf gptq gptq_bitblas gptq_marlin gptq_marlin_24 hqq inc ipex marlin modelopt modelopt_fp4 "
    "moe_wna16 mxfp4 petit_nvfp4 ptpc_fp8 quark torchao tpu_int8 fp_quant auto-round "
).split()
KV_DTYPES = ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"]
ATTN = (  # noqa: SIM905 - one word per choice, kept compact
    "FLASH_ATTN FLASH_ATTN_MLA FLASHINFER FLASHINFER_MLA TRITON_ATTN TRITON_MLA FLEX_ATTENTION "
    "TREE_ATTN XFORMERS TORCH_SDPA CUTLASS_MLA FLASHMLA FLASHMLA_SPARSE ROCM_ATTN ROCM_AITER_MLA "
    "ROCM_AITER_FA ROCM_AITER_UNIFIED_ATTN PALLAS CPU_ATTN NO_ATTENTION "
).split()
LOAD_FORMATS = (  # noqa: SIM905 - one word per choice, kept compact
    "auto pt safetensors npcache dummy tensorizer sharded_state gguf bitsandbytes mistral "
    "runai_streamer runai_streamer_sharded fastsafetensors "
).split()
WORDS = "the quick brown fox jumps over the lazy dog while sparks serve tokens across the ring".split()  # noqa: SIM905


def log(msg: str, level: str = "INFO") -> None:
    print(f"{level} {time.strftime('%m-%d %H:%M:%S')} [test-double] {msg}", flush=True)


def human_int(text: str) -> int:
    """vLLM-style sizes: 32768, 32k (x1000), 32K (x1024), 1m/1M, -1 for auto."""
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)([kKmMgG]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}")
    mult = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
    return int(float(m.group(1)) * mult)


def unit_fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


def json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def compilation(text: str):
    return int(text) if re.fullmatch(r"\d", text.strip()) else json_dict(text)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="vllm", allow_abbrev=False)
    top.add_argument("-v", "--version", action="version", version=VERSION)
    sub = top.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", allow_abbrev=False)
    boolean = argparse.BooleanOptionalAction
    p.add_argument("model")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--enable-expert-parallel", "-ep", action=boolean, default=False)
    p.add_argument("--distributed-executor-backend", choices=["ray", "mp", "uni", "external_launcher"])
    p.add_argument("--quantization", "-q", choices=QUANT)
    p.add_argument("--kv-cache-dtype", choices=KV_DTYPES, default="auto")
    p.add_argument("--attention-backend", choices=ATTN)
    p.add_argument("--gpu-memory-utilization", type=unit_fraction, default=0.9)
    p.add_argument("--max-model-len", type=human_int)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=human_int)
    p.add_argument("--max-cudagraph-capture-size", type=int)
    p.add_argument("--enable-prefix-caching", action=boolean, default=True)
    p.add_argument("--speculative-config", type=json_dict)
    p.add_argument("--default-chat-template-kwargs", type=json_dict)
    p.add_argument("--compilation-config", "-O", type=compilation)
    p.add_argument("--revision", default=None)
    p.add_argument("--download-dir", default=None)
    p.add_argument("--trust-remote-code", action=boolean, default=False)
    p.add_argument("--enforce-eager", action=boolean, default=False)
    p.add_argument("--load-format", choices=LOAD_FORMATS, default="auto")
    p.add_argument("--dtype", choices=["auto", "half", "float16", "bfloat16", "float", "float32"], default="auto")
    p.add_argument("--seed", type=int)
    p.add_argument("--enable-auto-tool-choice", action="store_true")
    p.add_argument("--tool-call-parser")
    p.add_argument("--reasoning-parser")
    p.add_argument("--chat-template")
    p.add_argument("--disable-log-stats", action="store_true")
    return top


def find_weights(model: str, revision: str | None, download_dir: str | None) -> Path:
    """Return the snapshot directory holding the model, or exit 1 saying what is missing."""
    if Path(model).is_dir():
        snap = Path(model)
    else:
        hub = Path(
            download_dir
            or os.environ.get("HF_HUB_CACHE")
            or Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
        )
        repo = hub / ("models--" + model.replace("/", "--"))
        rev = revision or "main"
        ref = repo / "refs" / rev
        commit = ref.read_text().strip() if ref.is_file() else rev
        snap = repo / "snapshots" / commit
        if not snap.is_dir():
            die(
                f"model {model!r} (revision {rev}) is not in the Hugging Face cache: {snap} does not exist "
                f"(looked in {hub}; the test double never downloads)"
            )
    if not (snap / "config.json").is_file():
        die(f"{snap} has no config.json: incomplete or wrong model copy")
    weights = [f for f in snap.iterdir() if f.suffix in (".safetensors", ".bin", ".pt", ".gguf")]
    if not weights:
        die(f"{snap} has config.json but no weight files (*.safetensors/*.bin/*.gguf)")
    index = snap / "model.safetensors.index.json"
    if index.is_file():
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        missing = sorted(s for s in shards if not (snap / s).is_file())
        if missing:
            die(f"{snap} lacks {len(missing)} of {len(shards)} shards named in its index, e.g. {missing[0]}")
    return snap


def die(msg: str, code: int = 1) -> None:
    log(msg, "ERROR")
    sys.exit(code)


class Engine:
    """Serving state: placement, liveness, counters, the prefix cache."""

    def __init__(self, args, snap: Path):
        self.args, self.snap = args, snap
        self.name = (args.served_model_name or [args.model])[0]
        self.names = args.served_model_name or [args.model]
        self.api_key = args.api_key or os.environ.get("VLLM_API_KEY") or None
        self.tok_s = float(os.environ.get("SPARKOPS_TEST_DOUBLE_TOK_S", "40"))
        self.max_model_len = args.max_model_len or 32768
        self.lock = threading.Lock()
        self.running = self.waiting = 0
        self.prompt_total = self.gen_total = self.queries = self.hits = 0
        self.blocks: dict[str, None] = {}
        self.slots = threading.Semaphore(args.max_num_seqs)
        self.dead: str | None = None
        self.bundle_nodes: set[str] = set()

    def place(self) -> None:
        world = self.args.tensor_parallel_size * self.args.pipeline_parallel_size
        backend = self.args.distributed_executor_backend or ("ray" if world > 1 else "uni")
        if backend != "ray":
            if world > 1:
                die(f"world size {world} needs {world} GPUs but backend {backend} only sees this node's one GPU")
            return
        import ray  # noqa: PLC0415 - only the Ray backend needs it
        from ray.util.placement_group import placement_group, placement_group_table  # noqa: PLC0415
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: PLC0415

        timeout = float(os.environ.get("SPARKOPS_TEST_DOUBLE_PG_TIMEOUT_S", "120"))
        ray.init(address="auto", log_to_driver=False, logging_level="WARNING")
        gpus = ray.cluster_resources().get("GPU", 0)
        log(
            f"connected to Ray: {len([n for n in ray.nodes() if n['Alive']])} nodes, {gpus:g} GPUs; "
            f"placing {world} bundles {{'GPU': 1}} (STRICT_SPREAD)"
        )
        pg = placement_group([{"GPU": 1}] * world, strategy="STRICT_SPREAD")
        try:
            ray.get(pg.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(pg)
            die(
                f"placement group of {world} x {{'GPU': 1}} (STRICT_SPREAD) not placed after {timeout:g} s: "
                f"cluster has {ray.cluster_resources().get('GPU', 0):g} GPUs"
            )

        @ray.remote(num_gpus=1, num_cpus=0)
        class Worker:
            def ping(self):
                return ray.get_runtime_context().get_node_id()

        self.workers = [
            Worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote() for i in range(world)
        ]
        ray.get([w.ping.remote() for w in self.workers], timeout=timeout)
        self.bundle_nodes = set(placement_group_table(pg)["bundles_to_node_id"].values())
        log(f"placement group placed on {len(self.bundle_nodes)} nodes; GPU workers up")
        threading.Thread(target=self.watch, args=(ray,), daemon=True).start()

    def watch(self, ray) -> None:
        while self.dead is None:
            time.sleep(float(os.environ.get("SPARKOPS_TEST_DOUBLE_WATCH_S", "3")))
            try:
                self.dead = dead_bundle_nodes(ray.nodes(), self.bundle_nodes)
            except Exception as exc:  # noqa: BLE001 - the GCS itself gone is a dead engine too
                self.dead = f"Ray GCS unreachable: {exc}"
            if self.dead:
                log(f"EngineDeadError: {self.dead}", "ERROR")
        # Like vLLM, whose API server shuts down once its engine is dead: answer
        # 500 for a short while (so a health check can see why), then exit non-zero
        # and leave the restart to the container's policy.
        time.sleep(float(os.environ.get("SPARKOPS_TEST_DOUBLE_DEAD_EXIT_S", "15")))
        log("shutting down: engine dead", "ERROR")
        os._exit(1)

    def prefix(self, tokens: list[str]) -> int:
        """Count queried and hit tokens per full 16-token block, like vLLM's prefix cache."""
        hit, h, hitting = 0, hashlib.sha256(), True
        with self.lock:
            self.queries += len(tokens)
            for i in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
                h.update(" ".join(tokens[i : i + BLOCK]).encode())
                key = h.hexdigest()
                if hitting and key in self.blocks and self.args.enable_prefix_caching:
                    hit += BLOCK
                else:
                    hitting = False
                self.blocks[key] = None
            while len(self.blocks) > 100_000:
                self.blocks.pop(next(iter(self.blocks)))
            self.hits += hit
        return hit

    def metrics(self) -> str:
        lab = f'engine="0",model_name="{self.name}"'
        usage = min(1.0, self.running * 256 / max(1, self.max_model_len))
        rows = [
            ("num_requests_running", "gauge", self.running),
            ("num_requests_waiting", "gauge", self.waiting),
            ("kv_cache_usage_perc", "gauge", usage),
            ("prefix_cache_queries_total", "counter", self.queries),
            ("prefix_cache_hits_total", "counter", self.hits),
            ("prompt_tokens_total", "counter", self.prompt_total),
            ("generation_tokens_total", "counter", self.gen_total),
        ]
        return "".join(f"# TYPE vllm:{n} {t}\nvllm:{n}{{{lab}}} {float(v)}\n" for n, t, v in rows)


def dead_bundle_nodes(nodes: list[dict], bundle_nodes: set[str]) -> str | None:
    alive = {n["NodeID"] for n in nodes if n.get("Alive")}
    gone = sorted(bundle_nodes - alive)
    return f"node(s) {', '.join(g[:12] for g in gone)} holding engine workers died" if gone else None


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    engine: Engine

    def log_message(self, fmt, *args):
        log(f'{self.client_address[0]} "{self.requestline}" {args[1] if len(args) > 1 else ""}')

    def send(self, status: int, body=b"", ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def error(self, status: int, kind: str, message: str) -> None:
        self.send(status, {"error": {"message": message, "type": kind, "code": status}})

    def authorized(self) -> bool:
        key = self.engine.api_key
        if key and self.path.startswith("/v1") and self.headers.get("Authorization") != f"Bearer {key}":
            self.send(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self):
        e = self.engine
        if self.path == "/health":
            self.send(500 if e.dead else 200, b"" if not e.dead else {"error": e.dead})
        elif self.path == "/metrics":
            self.send(200, e.metrics().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif self.path == "/version":
            self.send(200, {"version": VERSION})
        elif self.path == "/v1/models" and self.authorized():
            data = [
                {
                    "id": n,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "sparkops-test-double",
                    "root": e.args.model,
                    "parent": None,
                    "max_model_len": e.max_model_len,
                }
                for n in e.names
            ]
            self.send(200, {"object": "list", "data": data})
        elif not self.path.startswith("/v1/models"):
            self.send(404, {"detail": "Not Found"})

    def do_POST(self):
        e = self.engine
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            return self.send(404, {"detail": "Not Found"})
        if not self.authorized():
            return None
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            text = " ".join(str(m.get("content", "")) for m in req["messages"]) if chat else str(req["prompt"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return self.error(400, "BadRequestError", f"invalid request: {exc!r}")
        if req.get("model") not in e.names:
            return self.error(404, "NotFoundError", f"The model `{req.get('model')}` does not exist.")
        if e.dead:
            msg = f"EngineCore encountered an issue. See stack trace for the root cause. EngineDeadError: {e.dead}"
            return self.error(500, "InternalServerError", msg)
        prompt = text.split()
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        n = max(0, min(n, e.max_model_len - len(prompt)))
        with e.lock:
            e.waiting += 1
        e.slots.acquire()
        with e.lock:
            e.waiting -= 1
            e.running += 1
            e.prompt_total += len(prompt)
        try:
            hit = e.prefix(prompt)
            time.sleep(0.005 + (len(prompt) - hit) / 5000)  # prefill: cached blocks are free
            self.generate(req, chat, len(prompt), n)
        finally:
            with e.lock:
                e.running -= 1
            e.slots.release()
        return None

    def generate(self, req: dict, chat: bool, n_prompt: int, n: int) -> None:
        e, rid, created = self.engine, ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + n, "completion_tokens": n}
        finish = "length"
        base = {"id": rid, "created": created, "model": req["model"]}
        if not req.get("stream"):
            time.sleep(n / e.tok_s)
            with e.lock:
                e.gen_total += n
            out = " ".join(WORDS[i % len(WORDS)] for i in range(n))
            choice = {"index": 0, "logprobs": None, "finish_reason": finish}
            choice.update({"message": {"role": "assistant", "content": out}} if chat else {"text": out})
            return self.send(200, {**base, "object": obj, "choices": [choice], "usage": usage})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        def emit(choice_delta, finish_reason=None):
            c = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
            c.update({"delta": choice_delta} if chat else {"text": choice_delta.get("content", "")})
            self.wfile.write(f"data: {json.dumps({**base, 'object': chunk_obj, 'choices': [c]})}\n\n".encode())
            self.wfile.flush()

        try:
            if chat:
                emit({"role": "assistant", "content": ""})
            for i in range(n):
                if i:
                    time.sleep(1.0 / e.tok_s)
                emit({"content": (" " if i else "") + WORDS[i % len(WORDS)]}, finish if i == n - 1 else None)
                with e.lock:
                    e.gen_total += 1
            if (req.get("stream_options") or {}).get("include_usage"):
                self.wfile.write(
                    f"data: {json.dumps({**base, 'object': chunk_obj, 'choices': [], 'usage': usage})}\n\n".encode()
                )
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            log("client went away mid-stream", "WARNING")
        return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # vLLM's FlexibleArgumentParser accepts --max_model_len as well as --max-model-len.
    argv = [
        a.split("=", 1)[0].replace("_", "-") + ("=" + a.split("=", 1)[1] if "=" in a else "")
        if a.startswith("--")
        else a
        for a in argv
    ]
    args = parser().parse_args(argv)
    for flag in ("tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs"):
        if getattr(args, flag) < 1:
            parser().error(f"argument --{flag.replace('_', '-')}: must be >= 1")
    log(f"vLLM API server version {VERSION} (TEST DOUBLE, not vLLM)")
    log(f"non-default args: {json.dumps({k: v for k, v in vars(args).items() if v not in (None, False)}, default=str)}")
    snap = find_weights(args.model, args.revision, args.download_dir)
    log(f"weights found in {snap}")
    engine = Engine(args, snap)
    engine.place()
    Handler.engine = engine
    srv = ThreadingHTTPServer((args.host or "0.0.0.0", args.port), Handler)
    srv.daemon_threads = True
    log(f"Starting vLLM API server 0 on http://{args.host or '0.0.0.0'}:{srv.server_port}")
    log("Application startup complete.")
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        log("Shutting down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
