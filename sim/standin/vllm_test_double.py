"""TEST DOUBLE for vLLM's `vllm serve`: used ONLY in the sparkops simulated cluster. It is NOT vLLM.

It is installed as `vllm` in the stand-in image so the serving role can be run end to end on
machines without GPUs. Its command line, value sets, VLLM_* names and /metrics families are NOT
written here: they come from the contract recorded from the official vLLM wheel
(vllm-contract.json next to this file, a copy of plugins/plugin_utils/vllm_contracts/vllm-<v>.json
made by sim/record_vllm_contract.py for the default stack's release; vllm-contract-<release>.json for
every other recorded release, loaded when the image's vLLM reports that release: contract_file()).
What it proves, when a deployment passes against it:
  - the role passes a command line that real vLLM <v> accepts: every option of that release's parser
    is accepted (aliases, --no- forms, underscores, `--x.y` JSON keys, -O<n>), anything else exits 2
    with argparse's message, like vLLM's FlexibleArgumentParser; values vLLM only checks at engine
    config (quantization, attention backend, executor backend) fail there with exit 1;
    `vllm --version` and `vllm serve --help=all` answer from the recording;
  - the model's weights are where the Hugging Face cache layout says (HF_HUB_CACHE, HF_HOME/hub or
    --download-dir; models--org--name/snapshots/<rev>/ with config.json, a weight file and every
    shard named by an index; --revision honoured); otherwise it refuses to start;
  - with --distributed-executor-backend ray (or TP*PP > 1 without a backend or --nnodes) the Ray cluster really
    has TP*PP GPUs: vLLM 0.19.0's placement group of {"GPU": 1} bundles, strategy PACK, the first
    bundle on this node's VLLM_HOST_IP (vllm/v1/executor/ray_utils.py:454-478), waited for 1800 s
    (PG_WAIT_TIMEOUT, ray_utils.py:27, :284), one GPU actor per bundle; the port is bound at start
    but listens only once the engine is up, so a client is refused until then (api_server.py:541-548
    binds before the engine, serve_http listens after it, api_server.py:596, 684-688);
  - with --nnodes N (vLLM 0.19.0's own multi-node mp executor, ranks above 0 --headless) every rank really
    joins the head's store on --master-addr:--master-port and the head serves only then; ranks announce
    VLLM_HOST_IP, else the default route's address; a dead or stuck rank ends the engine at the next step
    after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS; a headless rank outlives its head (see MultiNode);
  - vLLM 0.19.0's torch.compile lines with its pinned torch 2.10.0 (AOT compile on, no mega-AOT):
    cold, compiled and saved where vLLM keeps the AOT artifact (a marker, no artifact); warm, loaded
    from there (see compile_log);
  - a TP member (a Ray actor on another node) that dies kills the engine the way vLLM 0.19.0's does:
    RayDistributedExecutor.check_health is a no-op ("Assume that the Ray workers are healthy",
    vllm/v1/executor/ray_executor.py), so an idle engine keeps answering /health 200; the next step
    (a request) calls the actors, fails (a stuck one after RAY_CGRAPH_get_timeout, 300 s,
    ray_executor.py:551-558), and the engine is dead (EngineDeadError): that request gets
    500 InternalServerError "EngineCore encountered an issue. ...", /health answers 503
    (vllm/entrypoints/serve/instrumentator/health.py), and the API server shuts down
    (engine_error_handler -> terminate_if_errored, or the 5 s watchdog_loop for a stream;
    vllm/entrypoints/launcher.py) and the process exits with status 0 (a graceful uvicorn shutdown;
    no sys.exit on that path): a restart policy `on-failure` does not restart it;
  - the API surface a client sees: /health, /version, /v1/models, /v1/chat/completions,
    /v1/completions (SSE streaming with stream_options.include_usage, non-streaming with usage), and
    the paths vLLM 0.19.0 serves WITHOUT the key (ROUTES below, each cited): POST /invocations runs a
    completion, /tokenize, /detokenize, /inference/v1/generate, /load, /ping, /scale_elastic_ep;
    Bearer-key checks on /v1/* only (before routing, as AuthenticationMiddleware); `--middleware`
    classes applied around all of it the way build_app does (see Gate); /metrics with the recorded
    families (vllm:*, http_*, process_*, python_*) with values that move: counters count requests and tokens, histograms
    observe the double's real timings (TTFT, inter-token, end-to-end, queue, prefill, decode);
    --disable-log-stats removes the vllm:* families, as in vLLM (no stat logger is made). Tokens
    come from an engine loop paced like a bandwidth-bound one (see PACING: a step's time grows with
    the running batch, calibrated on the reference; prefill grows with uncached prompt tokens;
    max_num_seqs and KV blocks make requests wait); prefix-cache hits counted per 16-token block;
    with --speculative-config, what 0.19.0's SpeculativeConfig refuses exits 1, a drafter must be in the
    cache like the model, and the vllm:spec_decode_* counters count drafts at the same pace (see
    "speculative decoding" below: the double never decodes faster with a drafter);
  - /v1/completions' prompt_logprobs as vLLM 0.19.0 answers it, from a deterministic text model that answers
    simple known-answer questions right, and a fault switch that makes it answer fluently but wrongly with
    /health still 200 (SIGUSR1, or SPARKOPS_TEST_DOUBLE_ANSWERS=wrong; see "answers" below).
What it CANNOT prove: anything about GPUs, CUDA, NCCL/RDMA, model quality or real speed, memory
fit, quantization or attention backends actually working, or that real vLLM's defaults match. Its
"tokens" are words. Only the standard library and `ray` are used. Logs go to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import hashlib
import importlib
import importlib.metadata as md
import inspect
import json
import math
import os
import random
import re
import resource
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

HERE = Path(__file__).resolve().parent
CONTRACT_FILE = Path(os.environ.get("SPARKOPS_TEST_DOUBLE_CONTRACT", HERE / "vllm-contract.json"))
BLOCK = 16
WORDS = "the quick brown fox jumps over the lazy dog while sparks serve tokens across the ring".split()  # noqa: SIM905
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
WATCHDOG_S = 5.0  # vllm/entrypoints/launcher.py VLLM_WATCHDOG_TIME_S
START = time.time()


def log(msg: str, level: str = "INFO") -> None:
    print(f"{level} {time.strftime('%m-%d %H:%M:%S')} [test-double] {msg}", flush=True)


def die(msg: str, code: int = 1) -> None:
    log(msg, "ERROR")
    sys.exit(code)


def installed_version(contract: dict) -> str:
    """The version the image's vLLM reports: `vllm --version` is importlib.metadata.version("vllm")
    (vllm/entrypoints/cli/main.py:59-61 in 0.19.0), /version and the start-up line vllm.version.__version__
    from vllm/_version.py (serve/instrumentator/basic.py:54-56, openai/api_server.py:67, :530); a build
    writes both from one setuptools-scm answer. In the stand-in image that is the metadata-only vllm dist
    (make_standin_dists.py), e.g. eugr's dirty-tree "0.19.1.dev0+g2a69949bd.d20260410.cu132"; outside an
    image (host tests) the recorded release's."""
    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return contract["vllm_version"]


_RELEASE_RE = re.compile(r"^(\d+\.\d+\.\d+)(\+[0-9A-Za-z.]+)?$")

# The API server's start-up lines, by the release of the contract the double speaks (the one its image
# reports, contract_file()): the version line, then the line before the port listens. Each recorded from that
# release's official wheel; a release without its own entry prints the default stack's lines.
#   0.33.0 (vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl, sha256 4b6bdec4...883aa):
#     vllm/entrypoints/launchers/launcher.py:367 setup_server -> vllm/entrypoints/common/startup.py:16-19,
#     log_version_and_model, "vLLM server version %s, serving model %s" (the form without the logo:
#     VLLM_DISABLE_LOG_LOGO, or a logger without a formatter; the logo carries the same two values);
#     launcher.py:368 -> startup.py:94-96 "non-default args: %s"; vllm/entrypoints/launchers/api_server/
#     entry.py:139 "Starting vLLM server on %s", the listen address of launcher.py:385-391
#     (http://<host or 0.0.0.0>:<port>).
STARTUP_LINES = {
    "0.33.0": ("vLLM server version {version}, serving model {model}", "Starting vLLM server on http://{host}:{port}"),
}
DEFAULT_STARTUP_LINES = ("vLLM API server version {version}", "Starting vLLM API server 0 on http://{host}:{port}")


def startup_lines(contract: dict) -> tuple[str, str]:
    """The version line and the listening line of the release `contract` was recorded from."""
    return STARTUP_LINES.get(str(contract.get("vllm_version")), DEFAULT_STARTUP_LINES)


def contract_file(version: str | None = None) -> Path:
    """The contract the double speaks: SPARKOPS_TEST_DOUBLE_CONTRACT when set; else the recording of the
    release the image carries (vllm-contract-<release>.json, written by sim/record_vllm_contract.py for each
    recorded release) when its vLLM reports a release, with or without a local label (vLLM's own image of a
    stack: "0.33.0"); else vllm-contract.json, the default stack's release (eugr's dirty-tree build of
    v0.19.0 reports "0.19.1.dev0+g2a69949bd.d<day>.cu132", no release of its own)."""
    if os.environ.get("SPARKOPS_TEST_DOUBLE_CONTRACT"):
        return CONTRACT_FILE
    if version is None:
        try:
            version = md.version("vllm")
        except md.PackageNotFoundError:
            version = ""
    match = _RELEASE_RE.match(version)
    if match and (HERE / f"vllm-contract-{match.group(1)}.json").is_file():
        return HERE / f"vllm-contract-{match.group(1)}.json"
    return CONTRACT_FILE


def load_contract() -> dict:
    path = contract_file()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"vllm test double: cannot read its contract {path}: {exc}", file=sys.stderr)
        sys.exit(1)


# --- the command line, from the recorded parser -----------------------------------------------------


def human_int(text: str) -> int:
    """vllm/engine/arg_utils.py human_readable_int: 32768, 25.6k (x1000), 32K (x1024), 1m/1M, 1g/1G."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text.strip())
    if m:
        number, suffix = m.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        mult = decimal.get(suffix) or binary[suffix]
        if suffix in binary and "." in number:
            raise argparse.ArgumentTypeError(f"Decimals are not allowed with binary suffixes like {suffix}.")
        return int(float(number) * mult)
    try:
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"Invalid number: {text!r}") from exc


def human_int_or_auto(text: str) -> int:
    return -1 if text.strip().lower() in ("auto", "-1") else human_int(text)


def json_value(text: str):
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"Value {text} cannot be converted to json: {exc}") from exc


TYPES = {
    "int": int,
    "float": float,
    "human_readable_int": human_int,
    "human_readable_int_or_auto": human_int_or_auto,
    "loads": json_value,
    "parse_dataclass": json_value,
}


def converter(spec: dict):
    """The value converter vLLM's parser uses for this option (recorded `type` and `inner_type`)."""
    typ, inner = spec.get("type"), spec.get("inner_type")
    if typ in TYPES:
        return TYPES[typ]
    if typ in ("_optional_type", "_parse_type") and inner in TYPES:
        conv = TYPES[inner]

        def parse(val: str):
            if typ == "_optional_type" and val in ("", "None"):
                return None
            try:
                return conv(val)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise argparse.ArgumentTypeError(f"Value {val} cannot be converted to {inner}.") from exc

        parse.__name__ = typ
        return parse
    if typ == "union_dict_and_str":
        return lambda val: json_value(val) if re.match(r"(?s)^\s*{.*}\s*$", val) else val
    return None


def flexible(args: list[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser.parse_args preprocessing (vllm/utils/argparse_utils.py, 0.19.0):
    underscores become dashes in option names (up to the first '.'), `--x.y v` sets key y of JSON option
    --x, -O3 / -O 3 mean --optimization-level 3, --help=<keyword> is a help search."""
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg.startswith("--help="):
            out.append("--help=" + arg.split("=", 1)[1])
        elif arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            key = "--" + head.replace("_", "-")
            if dot:
                if not eq:
                    value = args[i] if i < len(args) else ""
                    i += 1
                out.append(f"{key}={json.dumps(_nest(tail.split('.'), value))}")
                continue
            out.append(key + eq + value)
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]]
        elif arg == "-O" and i < len(args) and args[i] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(arg)
    return out


def _nest(keys: list[str], value: str):
    try:
        leaf = json.loads(value)
    except ValueError:
        leaf = value
    for key in reversed(keys):
        leaf = {key.rstrip("+"): leaf}
    return leaf


class EnableDisable(argparse.Action):
    """vLLM 0.33.0's EnableDisableAction (vllm/utils/argparse_utils.py:120-145): the option's own string sets its
    dest True; the `--enable-`/`--disable-` inverse and the `--no-` forms (registered, hidden from help) set it
    False (`option_string not in self.negative_option_strings`)."""

    def __init__(self, option_strings, dest, positive=(), **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.positive = set(positive)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string in self.positive)


def build_parser(contract: dict) -> argparse.ArgumentParser:
    version = installed_version(contract)
    top = argparse.ArgumentParser(prog="vllm", allow_abbrev=False)
    top.add_argument("-v", "--version", action="version", version=version)
    sub = top.add_subparsers(dest="cmd", required=True)
    serve = sub.add_parser("serve", allow_abbrev=False, add_help=False, usage="vllm serve [model_tag] [options]")
    serve.add_argument("model_tag", nargs="?")
    done: set[str] = set()
    for name, spec in contract["serve_options"].items():
        if spec["dest"] in done:
            continue
        done.add(spec["dest"])
        strings = [name, *spec["aliases"]]
        kind = spec["action"]
        if kind == "help":
            serve.add_argument(*strings, action="help")
        elif kind == "boolean_optional":
            positive = [s for s in strings if not s.startswith("--no-")]
            serve.add_argument(*positive, dest=spec["dest"], action=argparse.BooleanOptionalAction, default=None)
        elif kind == "EnableDisableAction":
            # the field's own option (arg_utils names it after the dest) is the positive one
            own = "--" + spec["dest"].replace("_", "-")
            serve.add_argument(*strings, dest=spec["dest"], action=EnableDisable, positive=[own], default=None)
        elif kind in ("store_true", "store_false", "store_const", "count"):
            serve.add_argument(*strings, dest=spec["dest"], action="store_true", default=None)
        else:
            kw = {"dest": spec["dest"], "default": None}
            if spec.get("nargs") is not None:
                kw["nargs"] = spec["nargs"]
            if spec.get("choices"):
                kw["choices"] = spec["choices"]
            elif converter(spec) is not None:
                kw["type"] = converter(spec)
            serve.add_argument(*strings, action="append" if kind == "append" else "store", **kw)
    return top


def engine_config_problems(args, contract: dict) -> list[str]:
    """What vLLM refuses after argparse, when it builds the engine config (exit 1): the value sets whose
    option is a free string, and the range checks of the config dataclasses."""
    out = []
    sets = contract["value_sets"]
    q = getattr(args, "quantization", None)
    if q and q != "None" and sets.get("quantization") and q not in sets["quantization"]:
        out.append(f"Unknown quantization method: {q}. Must be one of {sets['quantization']}.")
    a = getattr(args, "attention_backend", None)
    if a and a.lower() != "auto" and sets.get("attention_backend") and a.upper() not in sets["attention_backend"]:
        out.append(
            f"Unknown attention backend: '{a.upper()}'. Valid options are: {', '.join(sets['attention_backend'])}"
        )
    d = getattr(args, "distributed_executor_backend", None)
    if (
        d
        and "." not in d
        and sets.get("distributed_executor_backend")
        and d not in sets["distributed_executor_backend"]
    ):
        out.append(f"Unknown distributed executor backend: {d}")
    gmu = getattr(args, "gpu_memory_utilization", None)
    if gmu is not None and not 0 < gmu <= 1:
        out.append(
            f"1 validation error for CacheConfig\ngpu_memory_utilization\n  Input should be in (0, 1], got {gmu}"
        )
    for flag in ("tensor_parallel_size", "pipeline_parallel_size", "max_num_seqs"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            out.append(f"{flag} must be >= 1, got {value}")
    return out


def unknown_vllm_env(contract: dict) -> list[str]:
    known = set(contract["env_vars"])
    return sorted(n for n in os.environ if n.startswith("VLLM_") and n not in known)


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


# --- metrics, from the recorded families --------------------------------------------------------------


class Metrics:
    """The recorded families in Prometheus text format, with values the double really measures."""

    def __init__(self, contract: dict, model_name: str, log_stats: bool, cache_info: dict, extra=()):
        self.fams = [
            f for f in [*contract["metrics"], *extra] if log_stats or not f["name"].startswith("vllm:")
        ]  # --disable-log-stats: no PrometheusStatLogger, no vllm:* families (vllm/v1/engine/async_llm.py)
        self.base = {"engine": "0", "model_name": model_name}
        self.cache_info = cache_info
        self.lock = threading.Lock()
        self.values: dict[tuple, float] = {}
        self.hist: dict[tuple, list] = {}
        self.summ: dict[tuple, list] = {}
        self.created = time.time()
        self.by_name = {f["name"]: f for f in self.fams}

    def _family(self, name: str) -> dict | None:
        return self.by_name.get(name) or self.by_name.get(name + "_total")

    def inc(self, name: str, amount: float = 1.0, **labels) -> None:
        fam = self._family(name)
        if fam is None:
            return
        key = (fam["name"], tuple(sorted(labels.items())))
        with self.lock:
            self.values[key] = self.values.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels) -> None:
        fam = self._family(name)
        if fam is None:
            return
        with self.lock:
            self.values[(fam["name"], tuple(sorted(labels.items())))] = float(value)

    def observe(self, name: str, value: float, **labels) -> None:
        fam = self._family(name)
        if fam is None:
            return
        key = (fam["name"], tuple(sorted(labels.items())))
        with self.lock:
            if fam["type"] == "summary":
                s = self.summ.setdefault(key, [0, 0.0])
                s[0] += 1
                s[1] += value
                return
            bounds = [float(b) for b in fam["buckets"]]
            h = self.hist.setdefault(key, [[0] * len(bounds), 0, 0.0])
            for i, bound in enumerate(bounds):
                if value <= bound:
                    h[0][i] += 1
            h[1] += 1
            h[2] += value

    def _labels(self, fam: dict, extra: tuple) -> str:
        pairs = dict(self.base) if {"engine", "model_name"} <= set(fam["labels"]) else {}
        pairs.update(dict(extra))
        return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items())) + "}" if pairs else ""

    def _children(self, fam: dict, store: dict) -> list[tuple]:
        keys = [k[1] for k in store if k[0] == fam["name"]]
        # children vLLM creates up front (each finished_reason, sleep_state, source) exist from the start
        for lname, values in (fam.get("label_values") or {}).items():
            for v in values:
                if ((lname, v),) not in keys:
                    keys.append(((lname, v),))
        if not keys and set(fam["labels"]) <= {"engine", "model_name"}:
            keys.append(())
        return keys

    def render(self) -> str:
        self._process_values()
        out = []
        for fam in self.fams:
            name, typ = fam["name"], fam["type"]
            out.append(f"# HELP {name} {fam['help']}\n# TYPE {name} {typ}\n")
            created = []
            if name == "vllm:cache_config_info":
                labels = ",".join(f'{k}="{self.cache_info.get(k, "")}"' for k in sorted(fam["labels"]))
                out.append(f"{name}{{{labels}}} 1.0\n")
                continue
            if typ == "histogram":
                base = name
                for key in self._children(fam, self.hist) or [()]:
                    counts, n, total = self.hist.get((name, key), [[0] * len(fam["buckets"]), 0, 0.0])
                    lab = self._labels(fam, key)
                    for bound, c in zip(fam["buckets"], counts, strict=True):
                        le = f'le="{bound}"'
                        out.append(f"{base}_bucket{{{(lab[1:-1] + ',' if lab else '') + le}}} {float(c)}\n")
                    out.append(f"{base}_count{lab} {float(n)}\n{base}_sum{lab} {total}\n")
                    created.append(lab)
            elif typ == "summary":
                for key in [k[1] for k in self.summ if k[0] == name]:
                    n, total = self.summ[(name, key)]
                    lab = self._labels(fam, key)
                    out.append(f"{name}_count{lab} {float(n)}\n{name}_sum{lab} {total}\n")
                    created.append(lab)
            else:
                for key in self._children(fam, self.values):
                    lab = self._labels(fam, key)
                    out.append(f"{name}{lab} {self.values.get((name, key), 0.0)}\n")
                    created.append(lab)
            if typ in ("counter", "histogram", "summary") and created and not name.startswith(("process_", "python_")):
                stem = name[: -len("_total")] if typ == "counter" and name.endswith("_total") else name
                out.append(f"# HELP {stem}_created {fam['help']}\n# TYPE {stem}_created gauge\n")
                out.extend(f"{stem}_created{lab} {self.created}\n" for lab in created)
        return "".join(out)

    def _process_values(self) -> None:
        """process_* and python_* as prometheus_client's collectors compute them, from /proc and gc."""
        try:
            statm = Path("/proc/self/statm").read_text().split()
            page = os.sysconf("SC_PAGE_SIZE")
            self.set("process_virtual_memory_bytes", int(statm[0]) * page)
            self.set("process_resident_memory_bytes", int(statm[1]) * page)
            self.set("process_open_fds", len(os.listdir("/proc/self/fd")))
        except OSError:
            pass
        t = os.times()
        self.set("process_cpu_seconds_total", t.user + t.system)
        self.set("process_start_time_seconds", START)
        self.set("process_max_fds", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        for gen, stats in enumerate(gc.get_stats()):
            self.set("python_gc_objects_collected_total", stats["collected"], generation=str(gen))
            self.set("python_gc_objects_uncollectable_total", stats["uncollectable"], generation=str(gen))
            self.set("python_gc_collections_total", stats["collections"], generation=str(gen))
        v = sys.version_info
        self.set(
            "python_info",
            1,
            implementation=sys.implementation.name.capitalize().replace("Cpython", "CPython"),
            major=str(v.major),
            minor=str(v.minor),
            patchlevel=str(v.micro),
            version=f"{v.major}.{v.minor}.{v.micro}",
        )


def default_route_ip() -> str:
    """vLLM's get_ip() without VLLM_HOST_IP (vllm/utils/network_utils.py:46-72): a UDP socket's address
    toward a public one (no packet is sent)."""
    for family, addr in ((socket.AF_INET, "8.8.8.8"), (socket.AF_INET6, "2001:4860:4860::8888")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((addr, 80))
                return s.getsockname()[0]
        except OSError:
            pass
    return "0.0.0.0"  # noqa: S104 - what vLLM falls back to


def compile_log(args) -> None:
    """vLLM 0.19.0's torch.compile lines with its pinned torch==2.10.0: AOT compile on (vllm/envs.py:285-297),
    no mega-AOT artifact (torch < 2.12.0.dev, envs.py:300-307). The AOT artifact's path (compilation/
    decorators.py:469-499, under VLLM_CACHE_ROOT, envs.py get_default_cache_root) holds a marker: there, a
    warm start (caching.py:367-388 loads the graphs again, then decorators.py:303-305); absent, a cold one."""
    if args.enforce_eager:
        return  # CompilationMode.NONE: nothing is compiled, nothing logged
    rng = f"(1, {args.max_num_batched_tokens or 8192})"  # str(Range), vllm/config/utils.py:375-376
    root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vllm"
    )
    keys = ("model_tag", "revision", "tensor_parallel_size", "pipeline_parallel_size", "quantization", "dtype")
    key = hashlib.sha256(json.dumps([str(getattr(args, k, None)) for k in keys]).encode()).hexdigest()
    path = Path(root, "torch_compile_cache", "torch_aot_compile", key, "rank_0_0", "model")
    t0 = time.monotonic()
    if path.is_file():
        # backends.py:285-291, then decorators.py:303-305
        log(f"Directly load the compiled graph(s) for compile range {rng} from the cache, took 0.000 s")
        log(f"Directly load AOT compilation from path {path}")
    else:
        log(f"Compiling a graph for compile range {rng} takes 0.00 s")  # backends.py:390-395
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("TEST DOUBLE marker: vLLM's AOT artifact would be here; nothing was compiled\n")
            log(f"saved AOT compiled function to {path}")  # decorators.py:640-644
        except OSError as exc:
            log(f"unable to save AOT compiled function to {path}: {exc}", "WARNING")  # decorators.py:646-650
    log(f"torch.compile took {time.monotonic() - t0:.2f} s in total")  # monitor.py:20, :48
    log("Initial profiling/warmup run took 0.00 s")  # monitor.py:77-81


# --- pacing: a bandwidth-bound engine, calibrated on the reference -----------------------------------
# PACING, the ONE calibration of the simulated cluster's speed (every simulated profile uses it).
# Source: the seeds' two-Spark figures (/work/shared/docs/spark-facts.md "Serving"; the reference profile
# qwen3-235b-a22b-gptq-int4-tp2): vLLM 0.19.0, Qwen3-235B-A22B-GPTQ-Int4, TP=2/EP=2 on two Sparks, 17.0 tok/s
# per request at 1, 12.1 at 2, 9.1 at 4 (17.0/24.1/36.4 aggregate). A decode step reads the weights and the
# batch's KV once for the whole batch, so its time grows with the batch, and less than linearly (an MoE step
# reads more distinct experts the more sequences it holds): step_s(batch) = STEP_A_S * batch ** STEP_P, fitted
# by least squares on log(step time) at 1, 2, 4; fit error -0.9%, +1.9%, -0.9% (16.84, 12.32, 9.02 tok/s).
# A line a + b*batch cannot come within 5% (its best, minimax, misses by 5.8%). Beyond 4 it is an
# extrapolation (8: 6.6 tok/s each, 16: 4.8), not measured. PREFILL_TOK_S has no seed figure: an assumption
# (22B active parameters, two GB10s), on the slow side. SPARKOPS_TEST_DOUBLE_TOK_S sets one request's rate
# alone and scales the whole engine by the same factor (tests that need speed), keeping the batch curve.
REFERENCE_TOK_S = {1: 17.0, 2: 12.1, 4: 9.1}
STEP_A_S, STEP_P = 0.059366, 0.4508
PREFILL_TOK_S = 1000.0


# --- speculative decoding: vLLM 0.19.0's counters, at the paced rate ------------------------------------
# With --speculative-config vLLM registers four counters (vllm/v1/spec_decode/metrics.py:155-193,
# SpecDecodingProm; prometheus_client adds _total), labels [model_name, engine] and, for the per-position
# one, a "position" child per draft position created up front (:181-187). The scheduler records one draft per
# request per step that verified drafted tokens: num_draft_tokens = the drafted count, num_accepted = tokens
# sampled - 1 (vllm/v1/core/sched/scheduler.py:1369-1390); observe_draft adds the accepted count and counts
# positions 0..accepted-1 (metrics.py:39-45: accepted <= num_spec_tokens, and an accepted position implies
# every earlier one). The double draws `accepted` the way 0.19.0's own synthetic rejection sampler does
# (vllm/v1/worker/gpu/spec_decode/synthetic_rejection_sampler_utils.py:42-56): position i is accepted with
# probability a0 * decay**i until the first rejection, a0 chosen so that the mean over positions is the
# target rate (:102-140; decay at its floor 0.85, :8). The target is the config's synthetic_acceptance_rate,
# else SPARKOPS_TEST_DOUBLE_SPEC_ACCEPTANCE, else SPEC_ACCEPTANCE_DEFAULT: a setting, not a measurement
# (nobody has measured EAGLE-3 on the reference on GB10). NEVER KINDER: real speculative decoding emits
# 1 + accepted tokens per step; the double keeps the paced one token per step (no GB10 measurement to
# calibrate a speed-up on), so only the counters move.
SPEC_ACCEPTANCE_DEFAULT = 0.5
SPEC_DECAY = 0.85
SPEC_FAMILIES = (
    ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
    ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
    ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
    ("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position."),
)
# Methods that need no drafter repository (vllm/config/speculative.py:373-398); MTP aliases end in _mtp.
SPEC_NO_MODEL = ("mtp", "ngram", "ngram_gpu", "suffix", "extract_hidden_states")


def spec_families(k: int) -> list[dict]:
    """The four counter families as the recorded ones are shaped (contract["metrics"] entries)."""
    out = []
    for family, help_text in SPEC_FAMILIES:
        fam = {"name": family + "_total", "family": family, "type": "counter", "help": help_text}
        fam["labels"] = ["engine", "model_name"]
        if family.endswith("_per_pos"):
            fam["labels"] = ["engine", "model_name", "position"]
            fam["label_values"] = {"position": [str(i) for i in range(k)]}
        out.append(fam)
    return out


def spec_config_problems(spec: dict, contract: dict) -> list[str]:
    """What vLLM 0.19.0 refuses when it builds SpeculativeConfig(**json) (engine config, exit 1): unknown keys
    (pydantic extra="forbid", vllm/config/utils.py:69), a method outside SpeculativeMethod (:52-60),
    num_speculative_tokens <= 0 (Field gt=0, :71), tensor_parallel_size (:771-775), a drafter method without
    a model (:395-398), a missing num_speculative_tokens without n_predict (:777-782)."""
    if not isinstance(spec, dict):
        return [f"speculative_config must be a JSON object, got {spec!r}"]
    known = contract.get("speculative_config") or {}
    out = []
    extra = sorted(k for k in spec if known.get("fields") and k not in known["fields"])
    if extra:
        out.append(f"1 validation error for SpeculativeConfig\n{extra[0]}\n  Unexpected keyword argument")
    method = spec.get("method")
    if method is not None and known.get("methods") and method not in known["methods"]:
        out.append(f"1 validation error for SpeculativeConfig\nmethod\n  Input should be one of {known['methods']}")
    k = spec.get("num_speculative_tokens")
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k <= 0):
        out.append("1 validation error for SpeculativeConfig\nnum_speculative_tokens\n  Input should be greater than 0")
    if "tensor_parallel_size" in spec:
        out.append(
            "'tensor_parallel_size' is not a valid argument in the speculative_config. "
            "Please pass 'draft_tensor_parallel_size' instead."
        )
    short = "mtp" if isinstance(method, str) and method.endswith("_mtp") else (method or "draft_model")
    if spec.get("model") is None and short not in SPEC_NO_MODEL and k is not None:
        out.append("num_speculative_tokens was provided but without speculative model.")
    if k is None and short not in ("mtp", "suffix"):
        out.append(
            "num_speculative_tokens must be provided with speculative model unless the draft model config "
            "contains an n_predict parameter."
        )
    return out


class SpecDraws:
    """Accepted draft tokens per verification, as 0.19.0's synthetic rejection sampler draws them."""

    def __init__(self, k: int, rate: float, seed: int):
        self.k, self.rate = k, min(1.0, max(0.0, rate))
        self.rng = __import__("random").Random(seed)
        self.a0 = self._base(self.rate)

    def mean_rate(self, a0: float) -> float:
        """Mean over positions of P(position i accepted) = a0**(i+1) * decay**(i(i+1)/2)."""
        return sum(a0 ** (i + 1) * SPEC_DECAY ** (i * (i + 1) // 2) for i in range(self.k)) / self.k

    def _base(self, rate: float) -> float:
        if self.mean_rate(1.0) <= rate:
            return 1.0  # the decay caps what a chain can reach: accept every first try
        low, high = 0.0, 1.0
        for _ in range(60):  # bisection, bounded
            mid = (low + high) / 2
            low, high = (low, mid) if self.mean_rate(mid) >= rate else (mid, high)
        return high

    def draw(self) -> int:
        accepted, p = 0, self.a0
        while accepted < self.k and self.rng.random() < p:
            accepted += 1
            p *= SPEC_DECAY
        return accepted


def pace_scale() -> float:
    """How many times faster than the calibration the engine runs (1 unless SPARKOPS_TEST_DOUBLE_TOK_S)."""
    tok_s = os.environ.get("SPARKOPS_TEST_DOUBLE_TOK_S")
    return float(tok_s) * STEP_A_S if tok_s else 1.0


class Seq:
    """One request in the engine: prompt tokens still to compute, tokens out, KV tokens and blocks held."""

    def __init__(self, prompt: int, hit: int, n: int):
        self.prompt, self.n, self.out = prompt, max(n, 1), 0  # a prefill yields a token even for n=0
        self.todo = max(1, prompt - hit)  # vLLM recomputes at least the last prompt token on a full hit
        self.kv, self.blocks, self.scheduled, self.gone = prompt - self.todo, 0, None, False


class Scheduler:
    """vLLM v1's continuous batching, reduced (vllm/v1/core/sched/scheduler.py:348-780): each step takes the
    running requests first (a decode token each, or a prefill chunk) within max_num_batched_tokens, then
    admits waiting ones in order while fewer than max_num_seqs run and their KV blocks fit (allocate_slots
    None -> break, :757-765); a running request that cannot get a block preempts the last running one
    (RECOMPUTE: its KV freed, back to the head of the queue, :500-506, :962-976) and nothing new is admitted
    that step (:564). A step lasts step_s(batch) plus its prefill tokens over PREFILL_TOK_S."""

    def __init__(self, max_num_seqs: int, max_batched: int, num_blocks: int, scale: float):
        self.max_num_seqs, self.max_batched, self.num_blocks, self.scale = max_num_seqs, max_batched, num_blocks, scale
        self.free = num_blocks
        self.on_decode = None  # called with the number of decode tokens of a step (speculative counters)
        self.waiting: collections.deque[Seq] = collections.deque()
        self.running: list[Seq] = []
        self.cond = threading.Condition()
        threading.Thread(target=self.loop, daemon=True, name="EngineCore").start()

    def step_s(self, batch: int, prefill_tokens: int) -> float:
        return (STEP_A_S * batch**STEP_P + prefill_tokens / PREFILL_TOK_S) / self.scale

    def usage(self) -> float:
        return 1.0 - self.free / self.num_blocks  # block_pool.py:487-498

    def add(self, seq: Seq) -> None:
        with self.cond:
            self.waiting.append(seq)
            self.cond.notify_all()

    def wait(self, seq: Seq, count: int) -> None:
        """Until the request has `count` tokens out (1: its prefill is done)."""
        with self.cond:
            self.cond.wait_for(lambda: seq.out >= min(count, seq.n) or seq.gone)

    def drop(self, seq: Seq) -> None:
        """A finished or aborted request leaves the engine and frees its blocks."""
        with self.cond:
            seq.gone = True
            if seq in self.waiting:
                self.waiting.remove(seq)
            if seq in self.running:
                self.running.remove(seq)
            self.free += seq.blocks
            seq.blocks = 0
            self.cond.notify_all()

    def _alloc(self, seq: Seq, tokens: int) -> bool:
        need = -(-tokens // BLOCK) - seq.blocks
        if need > self.free:
            return False
        self.free -= max(need, 0)
        seq.blocks += max(need, 0)
        return True

    def schedule(self) -> list[tuple[Seq, int]]:
        budget, plan, preempted, i = self.max_batched, [], False, 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            chunk = min(seq.todo, budget) if seq.todo else 1
            while not self._alloc(seq, seq.kv + chunk):
                victim = self.running.pop()
                self.free += victim.blocks
                victim.blocks, victim.kv, victim.todo = 0, 0, victim.prompt + victim.out
                self.waiting.appendleft(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                plan.append((seq, chunk))
                budget -= chunk
                i += 1
        while not preempted and self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            chunk = min(seq.todo, budget)
            if not self._alloc(seq, seq.kv + chunk):
                break  # no KV room: it waits
            self.running.append(self.waiting.popleft())
            seq.scheduled = seq.scheduled or time.monotonic()
            plan.append((seq, chunk))
            budget -= chunk
        return plan

    def loop(self) -> None:
        clock = 0.0  # when the current step ends: steps follow each other on this clock, so the double's
        # own overhead (threads, sockets) is absorbed within a step instead of slowing every step
        while True:
            with self.cond:
                if not (self.waiting or self.running):
                    self.cond.wait_for(lambda: self.waiting or self.running)
                    clock = time.monotonic()  # idle until now: the next step starts now
                plan = self.schedule()
                if not plan:
                    self.cond.wait(0.05)
                    clock = time.monotonic()
                    continue
            # a lag behind the clock is made up within one step at most, never by a burst of short steps
            clock = max(clock, time.monotonic() - self.step_s(1, 0)) + self.step_s(
                len(plan), sum(c for s, c in plan if s.todo)
            )
            time.sleep(max(0.0, clock - time.monotonic()))
            decoded = 0
            with self.cond:
                for seq, chunk in plan:
                    if seq.gone or seq not in self.running:
                        continue
                    if seq.todo:
                        seq.todo -= chunk
                        seq.kv += chunk
                        seq.out += 0 if seq.todo else 1  # the step that ends a prefill samples a token
                    else:
                        seq.kv += 1
                        seq.out += 1
                        decoded += 1
                    if seq.out >= seq.n:
                        self.running.remove(seq)
                        self.free += seq.blocks
                        seq.blocks = 0
                self.cond.notify_all()
            if decoded and self.on_decode is not None:
                self.on_decode(decoded)


# --- answers: a deterministic text model, honest or wrong on purpose -----------------------------------
# The quality canary (plugins/module_utils/quality_probe.py) scores a reference passage with vLLM's
# prompt_logprobs and asks a few greedy known-answer questions. vLLM 0.19.0's CompletionRequest takes
# prompt_logprobs: int | None (vllm/entrypoints/openai/completion/protocol.py:83); check_logprobs refuses a
# positive value (or -1) with stream=true and a negative one other than -1, as 400s (protocol.py:384-397);
# the answer's choices[0].prompt_logprobs (protocol.py:469, set at completion/serving.py:527) is a list whose
# first element is None (vllm/logprobs.py:162-167) and then one {token id: Logprob} per prompt token: the
# prompt token with its rank, then the top-k with ranks 1..k (vllm/logprobs.py:175-205); Logprob is
# {logprob, rank, decoded_token} (vllm/logprobs.py:12-25); JSON makes the ids strings. A streamed choice has
# no prompt_logprobs field (CompletionResponseStreamChoice, protocol.py:489-504): none is streamed here.
# HONEST (default): a token's logprob is a fixed function of (previous word, word), in [-0.2, -5], so the
# passage's mean is the same on every probe and every restart, plus a per-token jitter of +-JITTER_NATS drawn
# afresh for each request: real kernels are not batch-invariant, so real logprobs move in their last digits
# from one batch to the next. Known-answer prompts ("Q: What is 17 + 25?\nA:", the capital of a country,
# 'Write the JSON object whose key "k" is N.') are answered right; every other prompt gets WORDS as before.
# WRONG (SPARKOPS_TEST_DOUBLE_ANSWERS=wrong at start, or SIGUSR1 while serving; SIGUSR2 back to honest): what
# a broken kernel or garbage weights give while /health stays 200: fluent-looking output made of the
# prompt's own words shuffled, and near-uniform logprobs, -ln(vocab_size) (config.json's, else 32000) +-0.05.
ANSWER_MODES = ("honest", "wrong")
JITTER_NATS = 0.02
TOP_LOGPROBS_CAP = 20  # prompt_logprobs -1 (the whole vocabulary in vLLM) is answered with this many
FACTS = {"france": "Paris", "italy": "Rome", "germany": "Berlin", "japan": "Tokyo", "spain": "Madrid"}
_LAST_Q = re.compile(r"Q:\s*(?P<q>[^\n]*)\nA:\s*$")
_ARITH = re.compile(r"What is (-?\d{1,9}) ?([-+*x]|plus|minus|times) ?(-?\d{1,9})\s*\?", re.IGNORECASE)
_CAPITAL = re.compile(r"What is the capital of ([A-Za-z ]+)\?", re.IGNORECASE)
_JSON_KEY = re.compile(r'Write the JSON object whose key "(\w{1,40})" is (-?\d{1,9})\.')


def token_id(word: str) -> int:
    """The double's token id of a word (as /tokenize answers)."""
    return int(hashlib.sha256(word.encode()).hexdigest()[:5], 16)


def _unit(*parts: str) -> float:
    return int(hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8], 16) / 16**8


class TextModel:
    """The double's deterministic language model: prompt logprobs and continuations, honest or wrong."""

    def __init__(self, snap: Path | None):
        mode = os.environ.get("SPARKOPS_TEST_DOUBLE_ANSWERS", "honest")
        if mode not in ANSWER_MODES:
            die(f"SPARKOPS_TEST_DOUBLE_ANSWERS={mode!r}: one of {', '.join(ANSWER_MODES)}")
        self.mode = mode
        self.vocab = 32000
        try:
            vocab = json.loads((snap / "config.json").read_text()).get("vocab_size") if snap else None
            if isinstance(vocab, int) and vocab > 1:
                self.vocab = vocab
        except (OSError, ValueError, AttributeError):
            pass

    def set_mode(self, mode: str) -> None:
        if mode != self.mode:
            log(f"TEST DOUBLE: answers are now {mode}" + (" (fluent but wrong; /health stays 200)" * (mode == "wrong")))
        self.mode = mode

    def prompt_logprobs(self, words: list[str], k: int) -> list:
        """choices[0].prompt_logprobs for a prompt of `words`, k = the request's prompt_logprobs."""
        rng = random.Random(os.urandom(8))
        k = TOP_LOGPROBS_CAP if k == -1 else min(k, TOP_LOGPROBS_CAP)
        out: list = [None]
        for prev, word in zip(words, words[1:], strict=False):
            h = _unit(prev, word)
            if self.mode == "wrong":
                lp = -math.log(self.vocab) + rng.uniform(-0.05, 0.05)
                rank = 1 + int(h * (self.vocab - 1))
            else:
                lp = -(0.2 + 4.8 * h * h) + rng.uniform(-JITTER_NATS, JITTER_NATS)
                rank = 1 if h < 0.5 else 1 + int((h - 0.5) * 200)
            pos = {str(token_id(word)): {"logprob": round(min(lp, 0.0), 6), "rank": rank, "decoded_token": word}}
            for r in range(1, k + 1):
                top = WORDS[int(_unit(word, str(r)) * len(WORDS))] if rank != r else word
                pos.setdefault(str(token_id(top)), {"logprob": -0.1 * r, "rank": r, "decoded_token": top})
            out.append(pos)
        return out

    @staticmethod
    def known_answer(prompt: str) -> str | None:
        m = _LAST_Q.search(prompt)
        if not m:
            return None
        q = m.group("q")
        if a := _ARITH.search(q):
            x, op, y = int(a.group(1)), a.group(2).lower(), int(a.group(3))
            return str(x + y if op in ("+", "plus") else x - y if op in ("-", "minus") else x * y)
        if c := _CAPITAL.search(q):
            return FACTS.get(c.group(1).strip().lower())
        if j := _JSON_KEY.search(q):
            return json.dumps({j.group(1): int(j.group(2))})
        return None

    def continuation(self, prompt: str, n: int, stop) -> tuple[list[str], str]:
        """The generated words (at most n) and the finish reason."""
        stops = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str)]
        if self.mode == "wrong":
            words = prompt.split() or list(WORDS)
            rng = random.Random(os.urandom(8))
            out = []
            while len(out) < n:
                batch = list(words)
                rng.shuffle(batch)
                out += batch
            return out[:n], "length"
        answer = self.known_answer(prompt)
        if answer is None:
            return [WORDS[i % len(WORDS)] for i in range(n)], "length"
        words = answer.split()
        if "\n" in stops:
            return words[:n], "stop" if len(words) <= n else "length"
        return (words + [WORDS[i % len(WORDS)] for i in range(n)])[:n], "length"


# --- the engine -------------------------------------------------------------------------------------


class Engine:
    """Serving state: placement, liveness, counters, the prefix cache."""

    def __init__(self, args, snap: Path, contract: dict):
        self.args, self.snap, self.contract = args, snap, contract
        self.names = args.served_model_name or [args.model_tag]
        self.name = self.names[0]
        keys = args.api_key or [os.environ.get("VLLM_API_KEY")]
        self.api_keys = [k for k in keys if k]
        self.max_model_len = args.max_model_len if args.max_model_len and args.max_model_len > 0 else 32768
        self.max_num_seqs = args.max_num_seqs or 256
        self.lock = threading.Lock()
        self.blocks: dict[str, None] = {}
        # KV blocks: --num-gpu-blocks-override, else room for two max-length requests (no GPU to profile)
        num_blocks = args.num_gpu_blocks_override or max(1024, 2 * -(-self.max_model_len // BLOCK))
        self.sched = Scheduler(self.max_num_seqs, args.max_num_batched_tokens or 8192, num_blocks, pace_scale())
        self.dead: str | None = None
        self.workers: list = []
        self.ray = None
        self.mp: MultiNode | None = None
        self.server: ThreadingHTTPServer | None = None
        prefix = True if args.enable_prefix_caching is None else args.enable_prefix_caching
        self.prefix_caching = prefix
        cache_info = {
            "block_size": str(args.block_size or BLOCK),
            "cache_dtype": args.kv_cache_dtype or "auto",
            "enable_prefix_caching": str(prefix),
            "engine": "0",
            "gpu_memory_utilization": str(args.gpu_memory_utilization or 0.9),
            "num_gpu_blocks": str(num_blocks),
        }
        spec = getattr(args, "speculative_config", None)
        self.spec_k = int(spec.get("num_speculative_tokens") or 1) if spec else 0
        extra = spec_families(self.spec_k) if spec else []
        self.metrics = Metrics(contract, self.name, not args.disable_log_stats, cache_info, extra)
        self.metrics.set("vllm:engine_sleep_state", 1, sleep_state="awake")
        self.text = TextModel(snap)
        if spec:
            rate = spec.get("synthetic_acceptance_rate")
            if rate is None:
                rate = float(os.environ.get("SPARKOPS_TEST_DOUBLE_SPEC_ACCEPTANCE", SPEC_ACCEPTANCE_DEFAULT))
            self.spec = SpecDraws(self.spec_k, float(rate), args.seed or 0)
            self.sched.on_decode = self.drafted
            log(
                f"speculative decoding {spec.get('method')}: {self.spec_k} tokens a draft (TEST DOUBLE: counted at "
                f"acceptance {self.spec.rate:g}, paced as without it)"
            )

    def drafted(self, n: int) -> None:
        """n requests verified one draft each in a step (scheduler.py:1369-1390, metrics.py:39-45)."""
        m = self.metrics
        for _ in range(n):
            accepted = self.spec.draw()
            m.inc("vllm:spec_decode_num_drafts")
            m.inc("vllm:spec_decode_num_draft_tokens", self.spec_k)
            m.inc("vllm:spec_decode_num_accepted_tokens", accepted)
            for pos in range(accepted):
                m.inc("vllm:spec_decode_num_accepted_tokens_per_pos", position=str(pos))

    def place(self) -> None:
        tp = self.args.tensor_parallel_size or 1
        pp = self.args.pipeline_parallel_size or 1
        world = tp * pp
        if (self.args.nnodes or 1) > 1:  # ParallelConfig.__post_init__: mp when nnodes > 1 (config/parallel.py:711-712)
            self.mp = MultiNode(self.args)
            self.mp.head()
            return
        backend = self.args.distributed_executor_backend or ("ray" if world > 1 else "uni")
        if backend != "ray":
            if world > 1:
                die(f"world size {world} needs {world} GPUs but backend {backend} only sees this node's one GPU")
            return
        import ray  # noqa: PLC0415 - only the Ray backend needs it
        from ray.util.placement_group import placement_group, placement_group_table  # noqa: PLC0415
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: PLC0415

        self.ray = ray
        timeout = self.pg_wait_s()
        ray.init(address="auto", log_to_driver=False, logging_level="WARNING")
        gpus = ray.cluster_resources().get("GPU", 0)
        log(f"connected to Ray: {len([n for n in ray.nodes() if n['Alive']])} nodes, {gpus:g} GPUs")
        if world > gpus:  # ray_utils.py:445-451
            log("The number of required GPUs exceeds the total number of available GPUs in the placement group.")
        # ray_utils.py:454-478: one {"GPU": 1} bundle per rank, the first on this node (get_ip(): VLLM_HOST_IP, else
        # the address of the default route, vllm/utils/network_utils.py:33-72), strategy PACK.
        specs = [{"GPU": 1.0} for _ in range(world)]
        specs[0][f"node:{os.environ.get('VLLM_HOST_IP') or default_route_ip()}"] = 0.001
        pg = placement_group(specs, strategy="PACK")
        ready, start, wait = pg.ready(), time.monotonic(), 10.0
        while time.monotonic() - start < timeout:  # ray_utils.py:281-299
            if ray.wait([ready], timeout=min(wait, max(0.0, timeout - (time.monotonic() - start))))[0]:
                break
            wait *= 2
            waited = int(time.monotonic() - start)
            log(f"Waiting for creating a placement group of specs for {waited} seconds. specs={specs}.")
        else:
            ray.util.remove_placement_group(pg)
            die(  # ray_utils.py:311-320
                f"ValueError: Cannot provide a placement group requiring {world} GPUs "
                f"(placement_group_specs={specs}) within {timeout:g} seconds. "
                f"Tensor parallel size may exceed available GPUs in your cluster ({gpus:g} GPUs)."
            )

        @ray.remote(num_gpus=1, num_cpus=0, max_restarts=0)
        class Worker:
            def execute_model(self):
                return ray.get_runtime_context().get_node_id()

            def pid(self):
                return os.getpid()

        self.workers = [
            Worker.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i)).remote() for i in range(world)
        ]
        ray.get([w.execute_model.remote() for w in self.workers], timeout=timeout)
        nodes = set(placement_group_table(pg)["bundles_to_node_id"].values())
        pids = ray.get([w.pid.remote() for w in self.workers], timeout=timeout)
        log(f"placement group placed on {len(nodes)} nodes; GPU workers up; worker pids {','.join(map(str, pids))}")
        log(f"RAY_CGRAPH_get_timeout is set to {self.step_timeout():g}")  # ray_executor.py:561-564

    @staticmethod
    def pg_wait_s() -> float:
        """vLLM waits PG_WAIT_TIMEOUT = 1800 s for its placement group (ray_utils.py:27, :284); a constant
        there, settable here only for the simulated cluster (sim/standin/Dockerfile)."""
        return float(os.environ.get("SPARKOPS_TEST_DOUBLE_PG_TIMEOUT_S", "1800"))

    @staticmethod
    def step_timeout() -> float:
        """vLLM sets RAY_CGRAPH_get_timeout to 300 s unless it is set (ray_executor.py:551-558): a stuck TP
        member (SIGSTOP, a hung collective) ends the engine after it."""
        return float(os.environ.get("RAY_CGRAPH_get_timeout", "300"))  # noqa: SIM112 - Ray's own name

    def step(self) -> None:
        """One engine step: every TP worker must answer, as vLLM's execute_model needs all of them.

        A dead actor (its node or its Ray gone) raises here, as it does in vLLM's Ray executor; the engine
        is then dead for good (EngineDeadError), like vLLM's EngineCore.
        """
        if self.dead:
            raise EngineDead(self.dead)
        if self.mp is not None:
            try:
                self.mp.step()
            except TimeoutError as exc:
                self.kill(f"TimeoutError: {exc}")
                raise EngineDead(self.dead) from exc
            return
        if not self.workers:
            return
        ray = self.ray
        try:
            ray.get([w.execute_model.remote() for w in self.workers], timeout=self.step_timeout())
        except Exception as exc:  # noqa: BLE001 - RayActorError, ActorDiedError, GetTimeoutError, ...
            self.kill(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            raise EngineDead(self.dead) from exc

    def kill(self, reason: str) -> None:
        with self.lock:
            if self.dead:
                return
            self.dead = reason
        log(f"EngineCore encountered a fatal error: {reason}", "ERROR")
        log(f"EngineDeadError: {ENGINE_DEAD_MESSAGE}", "ERROR")
        threading.Thread(target=self.watchdog, daemon=True).start()

    def watchdog(self) -> None:
        """vLLM's watchdog_loop: every 5 s, an errored engine makes the API server exit (uvicorn's
        graceful shutdown, exit status 0). A failed non-streaming request triggers it at once."""
        time.sleep(float(os.environ.get("SPARKOPS_TEST_DOUBLE_WATCHDOG_S", WATCHDOG_S)))
        self.shutdown()

    def shutdown(self) -> None:
        log("Shutting down FastAPI HTTP server.", "INFO")
        if self.server is not None:
            threading.Thread(target=self.server.shutdown, daemon=True).start()

    def prefix(self, tokens: list[str]) -> int:
        """Count queried and hit tokens per full 16-token block, like vLLM's prefix cache."""
        hit, h, hitting = 0, hashlib.sha256(), True
        with self.lock:
            for i in range(0, len(tokens) - len(tokens) % BLOCK, BLOCK):
                h.update(" ".join(tokens[i : i + BLOCK]).encode())
                key = h.hexdigest()
                if hitting and key in self.blocks and self.prefix_caching:
                    hit += BLOCK
                else:
                    hitting = False
                self.blocks[key] = None
            while len(self.blocks) > 100_000:
                self.blocks.pop(next(iter(self.blocks)))
        m = self.metrics
        if self.prefix_caching:
            m.inc("vllm:prefix_cache_queries", len(tokens))
            m.inc("vllm:prefix_cache_hits", hit)
        return hit

    def gauges(self) -> None:
        m = self.metrics
        with self.sched.cond:
            m.set("vllm:num_requests_running", len(self.sched.running))
            m.set("vllm:num_requests_waiting", len(self.sched.waiting))
            m.set("vllm:kv_cache_usage_perc", self.sched.usage())


class EngineDead(Exception):
    pass


# --- vLLM 0.19.0's own multi-node mode: --nnodes N --node-rank R --master-addr A --master-port P [--headless] ---
# What 0.19.0 does, and what stands for it here (one process per node, one GPU per node):
#  - `--nnodes > 1` without a backend means "mp" (config/parallel.py:711-712); "ray" (or any backend but mp, uni,
#    external_launcher) is refused by ParallelConfig (config/parallel.py:753-761), a pydantic dataclass, so the
#    ValueError reaches the user as a ValidationError for ParallelConfig; create_engine_config asserts before that
#    that world_size divides by nnodes and node_rank < nnodes (engine/arg_utils.py:1643-1649).
#  - every rank's worker joins torch.distributed at tcp://A:P (distributed/parallel_state.py:1385-1388, logged at
#    :1399-1406, init_process_group at :1422-1428); rank 0's TCPStore server waits for all world_size clients for the
#    process-group timeout: --distributed-timeout-seconds, else torch's NCCL default of 600 s (v1/worker/
#    gpu_worker.py:1030-1032), then "DistStoreError: Timed out after 601 seconds waiting for clients. 1/2 clients
#    joined."; a rank that cannot reach the store retries until the same timeout. Here: a TCP listener on A:P.
#  - the head (node rank 0, not --headless) runs the API server and the engine; its executor broadcasts each step
#    through a message queue bound on ITS get_ip() (multiproc_executor.py:129-151, shm_broadcast.py:407-423), and
#    each rank answers through a queue bound on ITS OWN get_ip() (shm_broadcast.py:819-832 -> :407-423). get_ip() is
#    VLLM_HOST_IP, else the address of the default route (utils/network_utils.py:27-72): without VLLM_HOST_IP that
#    is the management LAN's address. Here: the same two sockets, bound and dialled on the same addresses.
#  - a headless rank (--headless, node rank > 0) starts no API server (entrypoints/cli/serve.py:54-62, :115-116):
#    it logs its head's address (serve.py:187-198) and runs its worker until it dies (serve.py:200-202).
#  - a rank that dies after start: the head's worker monitor watches only ITS OWN worker processes
#    (multiproc_executor.py:257-288) and AsyncLLM.check_health only reads its own error flag (v1/engine/
#    async_llm.py:874-877), so an idle head keeps answering /health 200; the next step waits for the rank's answer
#    (a collective with a dead peer does not return: vLLM's pynccl never polls NCCL's async error) until
#    VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS (300 s, envs.py:186, :1368-1369; multiproc_executor.py:299-305, :369-378),
#    then "RPC call to execute_model timed out." ends the engine: EngineDeadError, as on the Ray path.
#  - a head that dies: nothing on a headless rank ends it. Its worker waits on the broadcast queue's ZMQ SUB socket
#    without a timeout (multiproc_executor.py:931-937, shm_broadcast.py:748-777), and its parent only watches that
#    worker (serve.py:200-201): torch logs once that the TCPStore is gone and the rank stays up, serving nothing,
#    and cannot rejoin a restarted head (vllm-project/vllm#32136, 2026-01; the warning as in gpustack/gpustack#6019).
#    Whoever restarts the head must restart every rank.
# Differences: the store listens on A only (torch's TCPStore listens on every address of the port), and the
# double's queues are plain TCP lines, not ZMQ; one rank per node (the simulated nodes have one GPU each).
MASTER_ADDR, MASTER_PORT = "127.0.0.1", 29501  # ParallelConfig defaults (config/parallel.py:237, :240)
TORCH_NCCL_PG_TIMEOUT_S = 600  # torch's default_pg_nccl_timeout: vLLM passes None unless --distributed-timeout-seconds
MP_ALLOWED_BACKENDS = ("mp", "uni", "external_launcher")  # config/parallel.py:753
WORKER_START_FAILED = (  # multiproc_executor.py:710-713
    "Exception: WorkerProc initialization failed due to an exception in a background process. "
    "See stack trace for root cause."
)


def get_ip() -> str:
    """vLLM's get_ip() (vllm/utils/network_utils.py:27-72): VLLM_HOST_IP, else the default route's address."""
    if "HOST_IP" in os.environ and "VLLM_HOST_IP" not in os.environ:
        log(
            "The environment variable HOST_IP is deprecated and ignored, as it is often used by Docker and other "
            "software to interact with the container's network stack. Please use VLLM_HOST_IP instead to set the IP "
            "address for vLLM processes to communicate with each other.",
            "WARNING",
        )
    return os.environ.get("VLLM_HOST_IP") or default_route_ip()


def tcp_uri(ip: str, port: int) -> str:
    return f"tcp://[{ip}]:{port}" if ":" in ip else f"tcp://{ip}:{port}"  # network_utils.py:134-138


def execute_model_timeout() -> float:
    """VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, 300 unless set (vllm/envs.py:186, :1368-1369)."""
    return float(os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "300"))


def multinode_problems(args) -> list[str]:
    """What 0.19.0 refuses about --nnodes/--node-rank/--headless, each with its exception's name; the first one
    raised ends the start (exit 1), so at most one is returned."""
    nnodes, rank = args.nnodes or 1, args.node_rank or 0
    if args.headless and (args.api_server_count or 0) > 0:  # entrypoints/cli/serve.py:54-60
        return [
            f"ValueError: --api-server-count={args.api_server_count} cannot be used with --headless "
            "(no API servers are started in headless mode)."
        ]
    if nnodes <= 1:
        return []
    world = (args.tensor_parallel_size or 1) * (args.pipeline_parallel_size or 1) * (args.data_parallel_size or 1)
    if world % nnodes:  # engine/arg_utils.py:1644-1646
        return [f"AssertionError: world_size={world} must be divisible by nnodes={nnodes}."]
    if rank >= nnodes:  # engine/arg_utils.py:1647-1649
        return [f"AssertionError: node_rank={rank} must be less than nnodes={nnodes}."]
    backend = args.distributed_executor_backend
    if backend is not None and backend not in MP_ALLOWED_BACKENDS:  # config/parallel.py:753-761, via pydantic
        return [
            "ValidationError: 1 validation error for ParallelConfig\n  Value error, nnodes > 1 can only be set when "
            "distributed executor backend is mp, uni or external_launcher. [type=value_error, input_type=ArgsKwargs]"
        ]
    return []


def multinode_unsupported(args) -> str | None:
    """Multi-node layouts 0.19.0 accepts that the double does not emulate (it says so instead of pretending)."""
    nnodes = args.nnodes or 1
    tp, pp = args.tensor_parallel_size or 1, args.pipeline_parallel_size or 1
    if (args.data_parallel_size or 1) > 1:
        return "--nnodes with --data-parallel-size > 1 is not emulated by the test double"
    if args.distributed_executor_backend not in (None, "mp"):
        return f"--nnodes with --distributed-executor-backend {args.distributed_executor_backend} is not emulated"
    if nnodes == 1:  # node_rank_within_dp == 0: data-parallel headless mode (serve.py:204-234)
        return "--headless without --nnodes > 1 is vLLM's data-parallel headless mode, not emulated by the test double"
    if tp * pp // nnodes > 1:
        return (
            f"world size {tp * pp} over {nnodes} nodes puts {tp * pp // nnodes} ranks on this node, which has one GPU"
        )
    if args.headless and not args.node_rank:
        # node_rank_within_dp == 0 with --headless is data-parallel headless mode (serve.py:204-234)
        return "--headless on node rank 0 is vLLM's data-parallel headless mode, not emulated by the test double"
    return None


class MultiNode:
    """One node's rank in vLLM 0.19.0's multi-node mp mode (see the block above): the head's rendezvous and step
    broadcast, or a headless rank that joins it and answers each step."""

    def __init__(self, args):
        self.nnodes, self.rank = args.nnodes or 1, args.node_rank or 0
        self.world = (args.tensor_parallel_size or 1) * (args.pipeline_parallel_size or 1)
        self.master = (args.master_addr or MASTER_ADDR, args.master_port or MASTER_PORT)
        seconds = args.distributed_timeout_seconds
        self.timeout = float(seconds) if seconds is not None else float(TORCH_NCCL_PG_TIMEOUT_S)
        self.ip = get_ip()
        self.lock = threading.Lock()
        self.failed = False
        self.peers: list[tuple[int, socket.socket, socket.socket]] = []  # head: (rank, its queue, its answers)
        self.keep: list[socket.socket] = []  # the store's connections, open while this process lives

    def init_line(self) -> None:
        # parallel_state.py:1399-1406, each rank's worker (rank = node rank: one GPU per node)
        uri = tcp_uri(*self.master)
        log(f"world_size={self.world} rank={self.rank} local_rank=0 distributed_init_method={uri} backend=nccl")

    def _bind(self, host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(64)
        return s

    def _start_failed(self, error: str) -> None:
        """A worker's torch.distributed error at start: the chain 0.19.0 logs on the way out, then exit 1."""
        log(f"WorkerProc failed to start.\n{error}", "ERROR")  # multiproc_executor.py:856-857
        log(WORKER_START_FAILED, "ERROR")
        if self.rank == 0:
            log("EngineCore failed to start.", "ERROR")  # v1/engine/core.py:1107-1108
            # v1/engine/utils.py:1057-1061
            die("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
                "{'EngineCore': 1}")  # fmt: skip
        die(WORKER_START_FAILED)

    @staticmethod
    def _line(conn: socket.socket, deadline: float | None) -> bytes:
        """One line from conn (b"" when the other end closed); TimeoutError past the deadline."""
        data = b""
        while not data.endswith(b"\n"):
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                conn.settimeout(remaining)
            else:
                conn.settimeout(None)
            try:
                chunk = conn.recv(1)
            except (ConnectionError, OSError) as exc:
                if isinstance(exc, TimeoutError):
                    raise
                return b""
            if not chunk:
                return b""
            data += chunk
        return data

    def head(self) -> None:
        """Node rank 0: the store on --master-addr:--master-port; returns once every rank has joined."""
        host, port = self.master
        log(  # multiproc_executor.py:134-144
            f"DP group leader: node_rank={self.rank}, node_rank_within_dp=0, master_addr={host}, "
            f"mq_connect_ip={self.ip} (local), world_size={self.world}, local_world_size=1"
        )
        self.init_line()
        try:
            store = self._bind(host, port)
        except OSError as exc:
            self._start_failed(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                f"address. port: {port}, useIpv6: {':' in host}, code: -{exc.errno}, name: {exc.strerror}"
            )
        deadline = time.monotonic() + self.timeout
        joined: dict[int, tuple[socket.socket, dict]] = {}
        while len(joined) < self.world - 1 and time.monotonic() < deadline:
            store.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn, _ = store.accept()
                hello = json.loads(self._line(conn, deadline) or b"{}")
            except (TimeoutError, ValueError):
                continue
            if hello.get("rank") is not None:
                joined[int(hello["rank"])] = (conn, hello)
        if len(joined) < self.world - 1:
            self._start_failed(
                f"torch.distributed.DistStoreError: Timed out after {int(self.timeout) + 1} seconds waiting for "
                f"clients. {len(joined) + 1}/{self.world} clients joined."
            )
        queue = self._bind(self.ip, 0)  # the step broadcast, on this node's get_ip() (multiproc_executor.py:133)
        handle = json.dumps({"mq": [self.ip, queue.getsockname()[1]]}).encode() + b"\n"
        for conn, _ in joined.values():
            conn.sendall(handle)
            self.keep.append(conn)
        queues: dict[int, socket.socket] = {}
        while len(queues) < len(joined) and time.monotonic() < deadline:
            queue.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                conn, _ = queue.accept()
                queues[int(self._line(conn, deadline) or b"-1")] = conn
            except (TimeoutError, ValueError):
                continue
        for r, (_, hello) in sorted(joined.items()):
            ip, rport = hello["answers"]
            answers = socket.create_connection((ip, rport), timeout=max(0.01, deadline - time.monotonic()))
            self.peers.append((r, queues[r], answers))
        ranks = ", ".join(f"rank {r} at {hello['ip']}" for r, (_, hello) in sorted(joined.items()))
        log(f"all {self.world} ranks joined the rendezvous on {tcp_uri(host, port)}: rank 0 at {self.ip}, {ranks}")

    def step(self) -> None:
        """One engine step: every rank must answer within VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS."""
        timeout = execute_model_timeout()
        with self.lock:
            if self.failed:  # the engine died with the first timeout (core.py:1106-1111): no second wait
                raise TimeoutError("RPC call to execute_model timed out.")
            deadline = time.monotonic() + timeout
            for _, queue, _ in self.peers:
                with contextlib.suppress(OSError):  # a publisher's send does not fail when a subscriber is gone
                    queue.sendall(b"step\n")
            for _, _, answers in self.peers:
                try:
                    answer = self._line(answers, deadline)
                except TimeoutError:
                    answer = b""
                if answer != b"ok\n":
                    time.sleep(max(0.0, deadline - time.monotonic()))  # a dead peer: the collective never returns
                    self.failed = True
                    raise TimeoutError("RPC call to execute_model timed out.")  # multiproc_executor.py:377-378

    def follow(self) -> int:
        """A headless rank: join the head's store (retrying until the timeout), then answer each step."""
        host, port = self.master
        try:
            answers = self._bind(self.ip, 0)  # this rank's answer queue, on its own get_ip()
        except OSError as exc:
            self._start_failed(f"zmq.error.ZMQError: {exc.strerror} (addr='{tcp_uri(self.ip, 0)}')")
        deadline = time.monotonic() + self.timeout
        store = None
        while store is None:
            try:
                store = socket.create_connection((host, port), timeout=max(0.01, min(1.0, deadline - time.monotonic())))
            except OSError:
                if time.monotonic() >= deadline:
                    self._start_failed(
                        f"torch.distributed.DistNetworkError: The client socket has timed out after "
                        f"{int(self.timeout * 1000)}ms while trying to connect to ({host}, {port})."
                    )
                time.sleep(0.2)
        hello = {"rank": self.rank, "ip": self.ip, "answers": [self.ip, answers.getsockname()[1]]}
        store.sendall(json.dumps(hello).encode() + b"\n")
        try:
            handle = self._line(store, deadline)
        except TimeoutError:
            handle = None
        if not handle:
            self._start_failed(
                "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. "
                "Did the remote server shutdown or crash?"
                if handle == b""
                else "torch.distributed.DistStoreError: Socket Timeout"
            )
        ip, qport = json.loads(handle)["mq"]
        queue = socket.create_connection((ip, qport), timeout=max(0.01, deadline - time.monotonic()))
        queue.sendall(f"{self.rank}\n".encode())
        answers.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            out, _ = answers.accept()
        except TimeoutError:
            self._start_failed("torch.distributed.DistStoreError: Socket Timeout")
        log(
            f"headless rank {self.rank} joined the head's rendezvous on {tcp_uri(host, port)} (announced {self.ip}, "
            f"head's queue at {ip}); no API server on this rank"
        )
        while self._line(queue, None) == b"step\n":
            out.sendall(b"ok\n")
        # the head is gone: torch's heartbeat monitor fails once on the store and gives up; the rank stays up
        now = time.time()
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1e9):09d}"
        print(
            f"[rank{self.rank}]:[W{stamp} ProcessGroupNCCL.cpp] [PG ID 0 PG GUID 0 Rank {self.rank}] Failed to check "
            'the "should dump" flag on TCPStore, (maybe TCPStore server has shut down too early), with error: Failed '
            "to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?",
            flush=True,
        )
        while True:
            time.sleep(3600)  # until a signal: SystemExit (serve.py:176-184)


def run_headless(args, version: str) -> int:
    """entrypoints/cli/serve.py run_headless for node_rank_within_dp > 0 (:154-202): no API server."""
    requested = False

    def on_signal(signum, frame):  # serve.py:176-184: SIGTERM/SIGINT raise SystemExit once
        nonlocal requested
        if not requested:
            requested = True
            raise SystemExit

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    mn = MultiNode(args)
    host, port = mn.master
    log(  # serve.py:193-198
        f"Launching vLLM (v{version}) headless multiproc executor, with head node address {host}:{port} for "
        "torch.distributed process group."
    )
    mn.init_line()
    return mn.follow()


# --- the HTTP server: vLLM 0.19.0's routes and middlewares ------------------------------------------

# Paths vLLM 0.19.0 registers for a generate model (build_app, vllm/entrypoints/openai/api_server.py:
# 170-243) and the methods each answers. Outside /v1 NONE of them checks --api-key
# (AuthenticationMiddleware only guards url_path.startswith("/v1"), openai/server_utils.py:80).
ROUTES = {
    "/health": {"GET"},  # serve/instrumentator/health.py:22
    "/metrics": {"GET"},  # serve/instrumentator/metrics.py:38-45 (expose + Mount "^/metrics(.*)$")
    "/version": {"GET"},  # serve/instrumentator/basic.py:54
    "/load": {"GET"},  # serve/instrumentator/basic.py:31
    "/ping": {"GET", "POST"},  # sagemaker/api_router.py:118-122, health()
    "/invocations": {"POST"},  # sagemaker/api_router.py:125-160: chat or completion, by body
    "/tokenize": {"POST"},  # serve/tokenize/api_router.py:38
    "/detokenize": {"POST"},  # serve/tokenize/api_router.py:64
    "/inference/v1/generate": {"POST"},  # serve/disagg/api_router.py:49 (attached for "generate")
    "/scale_elastic_ep": {"POST"},  # serve/elastic_ep/api_router.py:32 (attached for "generate")
    "/is_scaling_elastic_ep": {"POST"},  # serve/elastic_ep/api_router.py:90
    "/v1/models": {"GET"},  # openai/models/api_router.py:20
    "/v1/chat/completions": {"POST"},  # openai/chat_completion/api_router.py:40
    "/v1/completions": {"POST"},  # openai/completion/api_router.py:34
}
# Not emulated (404 here; behind the /v1 key in vLLM, or only with flags sparkops never sets):
# /v1/responses*, /v1/messages*, /v1/*/render, and the VLLM_SERVER_DEV_MODE, profiler, LoRA and
# tokenizer-info routes. /pooling, /classify, /score, /rerank exist only for pooling models
# (vllm/entrypoints/pooling/__init__.py register_pooling_api_routers): 404 for a generate model, as here.


def load_middlewares(paths: list[str]) -> list:
    """`--middleware` as build_app does (api_server.py:295-304): import each path at start-up; a class is
    added with app.add_middleware (each later one wraps the earlier ones, Starlette's user_middleware
    order); anything but a class or a coroutine function is a ValueError. An import error ends the start."""
    classes = []
    for path in paths:
        module_path, object_name = path.rsplit(".", 1)
        try:
            imported = getattr(importlib.import_module(module_path), object_name)
        except Exception as exc:  # noqa: BLE001 - vLLM's start dies on any of them
            die(f"{type(exc).__name__}: {exc} (--middleware {path})")
        if inspect.isclass(imported):
            classes.append(imported)
        elif inspect.iscoroutinefunction(imported):
            die(f"--middleware {path}: function middleware (app.middleware('http')) is not emulated by the test double")
        else:
            die(f"ValueError: Invalid middleware {path}. Must be a function or a class.")
    return classes


class Gate:
    """The `--middleware` classes around the double's routes, as ASGI: each request's scope goes through
    them; when the innermost app is reached the double's own handler answers, otherwise what the
    middleware sent is the answer. Starlette builds the stack at the first request (so a class whose
    __init__ raises answers 500 then, and is tried again on the next request)."""

    def __init__(self, classes: list):
        self.classes, self.stack, self.lock = classes, None, threading.Lock()
        self.local = threading.local()  # one request per thread (ThreadingHTTPServer)

    async def _inner(self, scope, receive, send):
        self.local.reached = True

    def build(self):
        with self.lock:
            if self.stack is None:
                app = self._inner
                for cls in self.classes:  # the last --middleware is the outermost
                    app = cls(app)
                self.stack = app
            return self.stack

    def run(self, scope: dict, receive) -> tuple[bool, list]:
        """(reached the routes, ASGI messages the middlewares sent)."""
        sent: list = []

        async def send(message):
            sent.append(message)

        self.local.reached = False
        asyncio.run(self.build()(scope, receive, send))
        return self.local.reached, sent


class Handler(BaseHTTPRequestHandler):
    server_version = "uvicorn"
    engine: Engine
    # vllm/entrypoints/serve/instrumentator/metrics.py: paths the instrumentator does not count
    NOT_COUNTED = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")

    def log_message(self, fmt, *args):
        log(f'{self.client_address[0]} "{self.requestline}" {args[1] if len(args) > 1 else ""}')

    def send(self, status: int, body=b"", ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.count(status, len(data))

    def count(self, status: int, size: int) -> None:
        path = self.path.split("?")[0]
        if path in self.NOT_COUNTED:
            return
        handler = path if path in ("/v1/models", "/v1/chat/completions", "/v1/completions") else "none"
        m = self.engine.metrics
        elapsed = time.monotonic() - getattr(self, "t0", time.monotonic())
        m.inc("http_requests_total", handler=handler, method=self.command, status=f"{str(status)[0]}xx")
        m.observe("http_request_size_bytes", int(self.headers.get("Content-Length") or 0), handler=handler)
        m.observe("http_response_size_bytes", size, handler=handler)
        m.observe("http_request_duration_highr_seconds", elapsed)
        m.observe("http_request_duration_seconds", elapsed, handler=handler, method=self.command)

    def error(self, status: int, kind: str, message: str) -> None:
        self.send(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})

    def body(self) -> bytes:
        if not hasattr(self, "_body"):
            self._body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        return self._body

    def json_body(self):
        try:
            return json.loads(self.body() or b"{}")
        except ValueError as exc:
            self.error(400, "BadRequestError", f"JSON decode error: {exc}")
            return None

    def passes_middlewares(self) -> bool:
        """Run the request's ASGI scope through the --middleware classes (Gate); False when one answered."""
        gate = self.engine.gate
        if not gate.classes:
            return True
        path, _, query = self.path.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": self.command,
            "scheme": "http",
            "path": unquote(path),
            "raw_path": path.encode("latin-1"),
            "query_string": query.encode("latin-1"),
            "root_path": "",
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()],
            "client": self.client_address[:2],
            "server": self.server.server_address[:2],
        }

        async def receive():
            return {"type": "http.request", "body": self.body(), "more_body": False}

        try:
            reached, sent = gate.run(scope, receive)
        except Exception as exc:  # noqa: BLE001 - uvicorn: "Exception in ASGI application", 500
            log(f"Exception in ASGI application: {exc!r}", "ERROR")
            self.send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return False
        if reached:
            return True
        start = next((m for m in sent if m["type"] == "http.response.start"), None)
        if start is None:  # uvicorn: "ASGI callable returned without starting response"
            self.send(500, b"Internal Server Error", "text/plain; charset=utf-8")
            return False
        data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        self.send_response(start["status"])
        for name, value in start.get("headers", []):
            self.send_header(name.decode("latin-1"), value.decode("latin-1"))
        self.end_headers()
        self.wfile.write(data)
        self.count(start["status"], len(data))
        return False

    def authorized(self) -> bool:
        """vLLM's --api-key (AuthenticationMiddleware, openai/server_utils.py:80): /v1 paths only, before routing."""
        keys = self.engine.api_keys
        if (
            keys
            and self.path.startswith("/v1")
            and self.headers.get("Authorization") not in [f"Bearer {k}" for k in keys]
        ):
            self.send(401, {"error": "Unauthorized"})
            return False
        return True

    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    do_HEAD = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_POST

    def dispatch(self):
        self.t0 = time.monotonic()
        if not self.passes_middlewares() or not self.authorized():
            return None
        path = self.path.split("?")[0]
        route = "/metrics" if path.startswith("/metrics") else path  # the Mount's regex
        if route not in ROUTES:
            return self.send(404, {"detail": "Not Found"})
        if self.command not in ROUTES[route]:
            return self.send(405, {"detail": "Method Not Allowed"})
        return getattr(self, "route_" + route.strip("/").replace("/", "_"))()

    def route_health(self):
        self.send(503 if self.engine.dead else 200, b"")

    route_ping = route_health  # sagemaker/api_router.py:122: `return await health(raw_request)`

    def route_metrics(self):
        self.engine.gauges()
        self.send(200, self.engine.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")

    def route_version(self):
        self.send(200, {"version": installed_version(self.engine.contract)})

    def route_load(self):
        # app.state.server_load_metrics: 0 unless --enable-server-load-tracking (api_server.py init_app_state)
        e = self.engine
        self.send(200, {"server_load": e.running if getattr(e.args, "enable_server_load_tracking", None) else 0})

    def route_v1_models(self):
        e = self.engine
        data = [
            {
                "id": n,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "sparkops-test-double",
                "root": e.args.model_tag,
                "parent": None,
                "max_model_len": e.max_model_len,
            }
            for n in e.names
        ]
        self.send(200, {"object": "list", "data": data})

    def model_unknown(self, req: dict) -> bool:
        """OpenAIServing._check_model: no model (or an empty one) means the served one (engine/serving.py:979)."""
        if req.get("model") and req.get("model") not in self.engine.names:
            self.error(404, "NotFoundError", f"The model `{req.get('model')}` does not exist.")
            return True
        return False

    def route_tokenize(self):
        """serve/tokenize: a completion-style (prompt) or chat-style (messages) body; the double's tokens are words."""
        req = self.json_body()
        if req is None or self.model_unknown(req):
            return
        try:
            text = (
                " ".join(str(m.get("content", "")) for m in req["messages"])
                if "messages" in req
                else str(req["prompt"])
            )
        except (KeyError, TypeError, AttributeError) as exc:
            return self.error(400, "BadRequestError", f"invalid request: {exc!r}")
        ids = [int(hashlib.sha256(w.encode()).hexdigest()[:5], 16) for w in text.split()]
        self.send(
            200, {"count": len(ids), "max_model_len": self.engine.max_model_len, "tokens": ids, "token_strs": None}
        )

    def route_detokenize(self):
        req = self.json_body()
        if req is None or self.model_unknown(req):
            return
        if not isinstance(req.get("tokens"), list):
            return self.error(400, "BadRequestError", "tokens: Field required")
        self.send(200, {"prompt": " ".join(WORDS[int(t) % len(WORDS)] for t in req["tokens"])})

    def route_invocations(self):
        """sagemaker/api_router.py:141-160: the first request type the body validates as, in order
        ChatCompletionRequest (messages), CompletionRequest (prompt); else 400. No key asked."""
        req = self.json_body()
        if req is None:
            return None
        if isinstance(req, dict) and isinstance(req.get("messages"), list):
            return self.complete(req, chat=True)
        if isinstance(req, dict) and "prompt" in req:
            return self.complete(req, chat=False)
        msg = (
            "Cannot find suitable handler for request. Expected one of: ['ChatCompletionRequest', 'CompletionRequest']"
        )
        return self.error(400, "BadRequestError", msg)

    def route_inference_v1_generate(self):
        """serve/disagg: token ids in (GenerateRequest: token_ids, sampling_params), token ids out."""
        req = self.json_body()
        if req is None or self.model_unknown(req):
            return None
        ids, params = req.get("token_ids"), req.get("sampling_params")
        if not isinstance(ids, list) or not isinstance(params, dict):
            return self.error(400, "BadRequestError", "token_ids and sampling_params are required")
        n = int(params.get("max_tokens") or 16)
        out = [int(hashlib.sha256(WORDS[i % len(WORDS)].encode()).hexdigest()[:5], 16) for i in range(n)]
        choice = {"index": 0, "logprobs": None, "finish_reason": "length", "token_ids": out}
        return self.send(200, {"request_id": req.get("request_id") or uuid.uuid4().hex, "choices": [choice]})

    def route_scale_elastic_ep(self):
        """serve/elastic_ep/api_router.py:41-60 checks the body, then asks the engine to scale; the double's
        engine has no elastic EP and answers 500 there (what vLLM does then is not emulated)."""
        req = self.json_body()
        if req is None:
            return None
        size = req.get("new_data_parallel_size")
        if size is None:
            return self.send(400, {"detail": "new_data_parallel_size is required"})
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            return self.send(400, {"detail": "new_data_parallel_size must be a positive integer"})
        return self.error(500, "InternalServerError", "the test double does not scale")

    def route_is_scaling_elastic_ep(self):
        self.send(200, {"is_scaling_elastic_ep": False})

    def route_v1_chat_completions(self):
        req = self.json_body()
        if req is not None:
            self.complete(req, chat=True)

    def route_v1_completions(self):
        req = self.json_body()
        if req is not None:
            self.complete(req, chat=False)

    def complete(self, req, chat: bool):
        e = self.engine
        try:
            text = " ".join(str(m.get("content", "")) for m in req["messages"]) if chat else str(req["prompt"])
        except (KeyError, TypeError, AttributeError) as exc:
            return self.error(400, "BadRequestError", f"invalid request: {exc!r}")
        if self.model_unknown(req):
            return None
        req = {**req, "model": req.get("model") or e.name}
        plp = req.get("prompt_logprobs")
        if not chat and plp is not None:
            # CompletionRequest.check_logprobs (vllm/entrypoints/openai/completion/protocol.py:384-397)
            if not isinstance(plp, int) or isinstance(plp, bool):
                return self.error(400, "BadRequestError", "prompt_logprobs: Input should be a valid integer")
            if req.get("stream") and (plp > 0 or plp == -1):
                return self.error(400, "BadRequestError", "`prompt_logprobs` are not available when `stream=True`.")
            if plp < 0 and plp != -1:
                return self.error(400, "BadRequestError", "`prompt_logprobs` must be a positive value or -1.")
        prompt = text.split()
        max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        n = max(0, min(max_tokens, e.max_model_len - len(prompt)))
        self.out_words, self.finish_reason = e.text.continuation(text, n, req.get("stop"))
        n = len(self.out_words)
        arrived = time.monotonic()
        hit = e.prefix(prompt)
        self.seq = Seq(len(prompt), hit, n)
        e.sched.add(self.seq)  # waits in the engine's queue for a slot and KV blocks
        try:
            try:
                e.step()  # the prefill step
            except EngineDead:
                # engine_error_handler: 500 with EngineDeadError's message, then terminate_if_errored
                self.error(500, "InternalServerError", ENGINE_DEAD_MESSAGE)
                e.shutdown()
                return None
            e.sched.wait(self.seq, 1)  # prefill done: cached blocks cost nothing
            self.generate(req, chat, prompt, hit, n, max_tokens, arrived, self.seq.scheduled or arrived)
        finally:
            e.sched.drop(self.seq)  # finished, or the client went away: vLLM aborts it
        return None

    def generate(self, req, chat, prompt, hit, n, max_tokens, arrived, scheduled) -> None:  # noqa: PLR0913, PLR0917 - one request's facts
        e, m = self.engine, self.engine.metrics
        rid, created = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex, int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n, "completion_tokens": n}
        base = {"id": rid, "created": created, "model": req["model"]}
        times: list[float] = []

        def token(i: int) -> str:
            e.sched.wait(self.seq, i + 1)  # the engine step that makes token i
            if i % 8 == 0 and i:
                e.step()  # decode steps call the workers too; a TP member lost mid-stream kills the engine
            times.append(time.monotonic())
            m.inc("vllm:generation_tokens")
            m.observe("vllm:iteration_tokens_total", 1)
            return self.out_words[i]

        m.inc("vllm:prompt_tokens", len(prompt))
        m.inc("vllm:prompt_tokens_by_source", len(prompt) - hit, source="local_compute")
        m.inc("vllm:prompt_tokens_by_source", hit, source="local_cache_hit")
        m.inc("vllm:prompt_tokens_cached", hit)
        m.observe("vllm:iteration_tokens_total", len(prompt) - hit)
        if not req.get("stream"):
            try:
                out = " ".join(token(i) for i in range(n))
            except EngineDead:
                self.error(500, "InternalServerError", ENGINE_DEAD_MESSAGE)
                e.shutdown()
                return
            self.finished(times, len(prompt), hit, n, max_tokens, arrived, scheduled)
            choice = {"index": 0, "logprobs": None, "finish_reason": self.finish_reason}
            choice.update({"message": {"role": "assistant", "content": out}} if chat else {"text": out})
            if not chat and req.get("prompt_logprobs") is not None:
                choice["prompt_logprobs"] = e.text.prompt_logprobs(prompt, req["prompt_logprobs"])
            self.send(200, {**base, "object": obj, "choices": [choice], "usage": usage})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        size = 0

        def emit(payload: dict) -> None:
            nonlocal size
            data = f"data: {json.dumps(payload)}\n\n".encode()
            size += len(data)
            self.wfile.write(data)
            self.wfile.flush()

        def chunk(delta, finish_reason=None):
            c = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
            c.update({"delta": delta} if chat else {"text": delta.get("content", "")})
            emit({**base, "object": chunk_obj, "choices": [c]})

        try:
            if chat:
                chunk({"role": "assistant", "content": ""})
            try:
                for i in range(n):
                    chunk({"content": (" " if i else "") + token(i)}, self.finish_reason if i == n - 1 else None)
            except EngineDead:
                # the 200 is already sent: vLLM sends the error as the next chunk; its watchdog stops the server
                emit({"error": {"message": ENGINE_DEAD_MESSAGE, "type": "InternalServerError", "code": 500}})
                self.wfile.write(b"data: [DONE]\n\n")
                return
            self.finished(times, len(prompt), hit, n, max_tokens, arrived, scheduled)
            if (req.get("stream_options") or {}).get("include_usage"):
                emit({**base, "object": chunk_obj, "choices": [], "usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            log("client went away mid-stream", "WARNING")
            m.inc("vllm:request_success", 0, finished_reason="abort")
        finally:
            self.count(200, size)

    def finished(self, times, n_prompt, hit, n, max_tokens, arrived, scheduled) -> None:  # noqa: PLR0913, PLR0917 - one request's facts
        """What vLLM's PrometheusStatLogger records for a finished request (vllm/v1/metrics/loggers.py)."""
        m, now = self.engine.metrics, time.monotonic()
        first = times[0] if times else now
        m.inc("vllm:request_success", finished_reason="length")
        m.observe("vllm:time_to_first_token_seconds", first - arrived)
        for a, b in zip(times, times[1:], strict=False):
            m.observe("vllm:inter_token_latency_seconds", b - a)
        if n > 1:
            m.observe("vllm:request_time_per_output_token_seconds", (times[-1] - first) / (n - 1))
        m.observe("vllm:e2e_request_latency_seconds", now - arrived)
        m.observe("vllm:request_queue_time_seconds", scheduled - arrived)
        m.observe("vllm:request_inference_time_seconds", now - scheduled)
        m.observe("vllm:request_prefill_time_seconds", first - scheduled)
        m.observe("vllm:request_decode_time_seconds", now - first)
        m.observe("vllm:request_prompt_tokens", n_prompt)
        m.observe("vllm:request_generation_tokens", n)
        m.observe("vllm:request_max_num_generation_tokens", max_tokens)
        m.observe("vllm:request_params_max_tokens", max_tokens)
        m.observe("vllm:request_params_n", 1)
        m.observe("vllm:request_prefill_kv_computed_tokens", n_prompt - hit)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    contract = load_contract()
    version = installed_version(contract)
    argv = flexible(argv)
    if argv[:1] == ["serve"] and any(a.startswith("--help=") for a in argv):
        # `vllm serve --help=all`: the recorded text of that release (a keyword search prints the same)
        sys.stdout.write(contract.get("help_all", ""))
        return 0
    args = build_parser(contract).parse_args(argv)
    if not args.model_tag:
        die("`model` should be provided as the first positional argument when using `vllm serve`.")
    problems = multinode_problems(args)
    if problems and problems[0].startswith("ValueError: --api-server-count"):  # serve.py:54-60, before anything
        log(problems[0], "ERROR")
        return 1
    if not args.headless:  # a headless rank runs no API server and logs neither line (serve.py:115-116)
        line = startup_lines(contract)[0].format(version=version, model=args.model_tag)
        log(f"{line} (TEST DOUBLE, not vLLM)")
        log(f"non-default args: {json.dumps({k: v for k, v in vars(args).items() if v is not None}, default=str)}")
    for name in unknown_vllm_env(contract):
        # vllm/envs.py validate_environ: a warning, or a ValueError with --fail-on-environ-validation
        if getattr(args, "fail_on_environ_validation", None):
            log(f"ValueError: Unknown vLLM environment variable detected: {name}", "ERROR")
            return 1
        log(f"Unknown vLLM environment variable detected: {name}", "WARNING")
    spec = getattr(args, "speculative_config", None)
    config_problems = [f"ValueError: {p}" for p in engine_config_problems(args, contract)]
    if spec is not None:
        config_problems += [f"ValueError: {p}" for p in spec_config_problems(spec, contract)]
    config_problems += problems
    if config_problems:
        for p in config_problems:
            log(p, "ERROR")
        return 1
    if (args.nnodes or 1) > 1 or args.headless:
        why = multinode_unsupported(args)
        if why:
            die(why)
        if args.node_rank and not args.headless:
            # a follower node's executor has no broadcast queue: the engine's first collective_rpc asserts
            # (multiproc_executor.py:341-343) and the engine core fails to start (v1/engine/utils.py:1057-1061)
            log("AssertionError: collective_rpc should not be called on follower node", "ERROR")
            log("EngineCore failed to start.", "ERROR")
            die("RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
                "{'EngineCore': 1}")  # fmt: skip
    snap = find_weights(args.model_tag, args.revision, args.download_dir)
    log(f"weights found in {snap}")
    drafter = (spec or {}).get("model")
    if drafter and not str(drafter).startswith("/") and drafter not in ("ngram", "ngram_gpu", "suffix"):
        # the drafter loads from the same offline cache (ModelConfig(model=..., revision=...),
        # vllm/config/speculative.py:467-486): missing on this node, vLLM fails to start
        log(f"drafter weights found in {find_weights(drafter, spec.get('revision'), args.download_dir)}")
    if args.headless:
        return run_headless(args, version)
    engine = Engine(args, snap, contract)
    Handler.engine = engine
    # vLLM binds its port before the engine starts and listens once it is up (api_server.py:541-548, :596):
    # until then a client's connection is refused.
    srv = ThreadingHTTPServer((args.host or "0.0.0.0", args.port or 8000), Handler, bind_and_activate=False)  # noqa: S104
    srv.request_queue_size = 2048  # uvicorn's listen backlog (Config backlog=2048), not socketserver's 5
    srv.server_bind()
    engine.place()
    compile_log(args)
    # build_app runs once the engine is up (api_server.py run_server_worker): --middleware is imported there
    engine.gate = Gate(load_middlewares(getattr(args, "middleware", None) or []))
    srv.server_activate()
    srv.daemon_threads = True
    engine.server = srv

    # vLLM 0.19.0's API server ends on SIGTERM and SIGINT (launcher.py:97-104, serve_http): the engine is shut
    # down at once (shutdown_timeout defaults to 0, config/vllm.py:336), which ends the streams in flight, and
    # the HTTP server stops (launcher.py:137, "Shutting down FastAPI HTTP server."). Without it this process,
    # PID 1 of its container, would ignore `docker stop`'s SIGTERM until the kill. Under the Ray executor this
    # one process is also Ray's driver, whose handler (ray.init) ends it at once; that is left as it was.
    stopped = []

    def on_stop_signal(signum, frame):
        stopped.append(signum)
        engine.shutdown()

    if "ray" not in sys.modules:
        signal.signal(signal.SIGTERM, on_stop_signal)
        signal.signal(signal.SIGINT, on_stop_signal)
    # TEST DOUBLE fault switch (no vLLM counterpart): answers turn wrong on SIGUSR1, honest again on SIGUSR2
    signal.signal(signal.SIGUSR1, lambda signum, frame: engine.text.set_mode("wrong"))
    signal.signal(signal.SIGUSR2, lambda signum, frame: engine.text.set_mode("honest"))
    if engine.text.mode == "wrong":
        log("TEST DOUBLE: SPARKOPS_TEST_DOUBLE_ANSWERS=wrong: answers are fluent but wrong; /health stays 200")
    log(startup_lines(contract)[1].format(host=args.host or "0.0.0.0", port=srv.server_port))
    log("Application startup complete.")
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        log("Shutting down")
    if engine.dead or stopped:
        log("Application shutdown complete.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
