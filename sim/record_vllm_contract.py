#!/usr/bin/env python3
"""Record the `vllm serve` contract of a vLLM release from its official wheel.

For each version asked for, this script:
  1. downloads the official wheel from PyPI (`pip download vllm==<version> --no-deps`) and records its
     file name and sha256;
  2. installs it with --no-deps into a scratch virtualenv under --work, with the light pure-Python
     dependencies the wheel declares and a CPU torch (GPU-only packages are left out: nothing here
     runs a model);
  3. runs the release's OWN code in that virtualenv: its real `vllm serve` argument parser
     (FlexibleArgumentParser + ServeSubcommand.subparser_init; every option string it accepts, from its
     `_option_string_actions`, help-hidden ones marked `hidden`), `vllm serve --help=all`, the value
     sets from the Literal types and enums the parser is built from, `vllm.envs.environment_variables`,
     and the Prometheus families that the API server process registers: the release's own
     PrometheusStatLogger and log_engine_initialized (fed a default ObservabilityConfig and CacheConfig
     of that release, no speculative decoding, no LoRA, no KV connector: what a default `vllm serve` has),
     the prometheus-fastapi-instrumentator set up exactly as vllm/entrypoints/serve/instrumentator/
     metrics.py does, and prometheus_client's default process/platform/GC collectors;
  4. writes plugins/plugin_utils/vllm_contracts/vllm-<version>.json (keys: vllm_version, source,
     serve_options, value_sets, env_vars, metrics, and speculative_config read from the installed
     vllm/config/speculative.py) and vllm-<version>.help.txt (the raw help text),
     and copies the pinned version's fixture to sim/standin/vllm-contract.json (and every recorded
     release's to sim/standin/vllm-contract-<release>.json) so the simulated cluster's test double loads
     the same contract as the release its image carries.

Usage:
    python3 sim/record_vllm_contract.py 0.19.0 0.33.0 [--work /tmp/vllm-contract] [--pinned 0.19.0]
    python3 sim/record_vllm_contract.py 0.19.0 --speculative-from /path/to/unpacked/vllm   (that key only)

Needs PyPI (pip download/install) and ~2 GB under --work. Wheels are never written into the repository.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "plugins" / "plugin_utils" / "vllm_contracts"
STANDIN_COPY = ROOT / "sim" / "standin" / "vllm-contract.json"
# CPU torch that installs from the local wheel cache; only vLLM's import chain needs it.
TORCH = "torch==2.13.0"
# Dependencies the wheel declares that are GPU kernels or compilers: not needed to build the parser or
# register metrics, and most have no CPU wheel. Everything else the wheel requires is installed.
SKIP_DEPS = re.compile(
    r"^(torch|torchaudio|torchvision|flashinfer|nvidia-|quack|triton|xformers|cupy|tilelang|deep-gemm|deep_gemm|"
    r"flash-attn|flash_attn|apache-tvm|pynvvideocodec|nvtx|humming-kernels|tokenspeed-mla|torchcodec)",
    re.IGNORECASE,
)

# Building the serve parser computes DeviceConfig's defaults, which needs a platform with a device type;
# this machine has no GPU and the CUDA platform needs libcudart. A stand-in platform that says "cuda" but
# is not CUDA (so no CUDA kernel is probed) lets the release's own parser be built. Options and choices
# do not depend on it; a few printed defaults might.
SHIM = r"""
import vllm.platforms as _platforms
from vllm.platforms.interface import Platform as _Platform, PlatformEnum as _PlatformEnum


class RecorderPlatform(_Platform):
    _enum = _PlatformEnum.OOT
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"
    ray_device_key = "GPU"
    dist_backend = "nccl"
    device_control_env_var = "CUDA_VISIBLE_DEVICES"


_platforms._current_platform = RecorderPlatform()
"""
HELP = (
    SHIM
    + r"""
import sys
from vllm.entrypoints.cli.main import main
sys.argv = ["vllm", *sys.argv[1:]]
main()
"""
)

# Runs inside the scratch virtualenv, with the release's own modules. Prints one JSON object.
INNER = (
    SHIM
    + "\n"
    + "__SERVE_OPTIONS_SOURCE__"
    + r"""
import argparse, json, os, sys, typing
os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand

top = FlexibleArgumentParser(prog="vllm")
sub = top.add_subparsers(dest="subparser")
serve = ServeSubcommand().subparser_init(sub)

options, positionals = serve_options(serve)

def choices_of(opt):
    c = options.get(opt, {}).get("choices")
    return sorted(c) if c else None

from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
value_sets = {"quantization": list(QUANTIZATION_METHODS)}
import vllm.config.cache as cache_mod
value_sets["kv_cache_dtype"] = list(typing.get_args(cache_mod.CacheDType))
try:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
except ImportError:
    from vllm.attention.backends.registry import AttentionBackendEnum
value_sets["attention_backend"] = [m.name for m in AttentionBackendEnum]
try:
    import vllm.config.kernel as kernel_mod
    value_sets["moe_backend"] = list(typing.get_args(kernel_mod.MoEBackend))
except (ImportError, AttributeError):
    value_sets["moe_backend"] = None
import vllm.config.parallel as parallel_mod
value_sets["distributed_executor_backend"] = list(typing.get_args(parallel_mod.DistributedExecutorBackend))
parser_sets = {
    "quantization": choices_of("--quantization"),
    "kv_cache_dtype": choices_of("--kv-cache-dtype"),
    "attention_backend": choices_of("--attention-backend"),
    "moe_backend": choices_of("--moe-backend"),
    "distributed_executor_backend": choices_of("--distributed-executor-backend"),
}

import vllm.envs as envs
env_vars = sorted(envs.environment_variables)

# Metrics: what the API server process of a default `vllm serve` registers in its registry.
from prometheus_client import REGISTRY, generate_latest
from types import SimpleNamespace
from vllm.config import CacheConfig, ObservabilityConfig
from vllm.v1.metrics.loggers import PrometheusStatLogger
cache = CacheConfig()
cache.num_gpu_blocks = 1024
cfg = SimpleNamespace(
    observability_config=ObservabilityConfig(),
    model_config=SimpleNamespace(served_model_name="recorded-model", max_model_len=32768, is_diffusion=False),
    cache_config=cache,
    speculative_config=None,
    lora_config=None,
    kv_transfer_config=None,
    kv_events_config=None,
    ec_transfer_config=None,
    watermark_config=None,
    parallel_config=SimpleNamespace(data_parallel_size=1, tensor_parallel_size=1, pipeline_parallel_size=1),
    scheduler_config=SimpleNamespace(max_num_seqs=256, max_num_batched_tokens=8192),
)
stat_logger = PrometheusStatLogger(cfg, [0])
stat_logger.log_engine_initialized()
from fastapi import FastAPI
from fastapi.testclient import TestClient
from vllm.entrypoints.serve.instrumentator.metrics import attach_router
app = FastAPI()
attach_router(app)
# The instrumentator registers its http_* families when the app's middleware is built: one request does it.
with TestClient(app) as client:
    client.get("/v1/models")
    assert client.get("/metrics").status_code == 200
text = generate_latest(REGISTRY).decode()
print(json.dumps({
    "options": options, "positionals": positionals, "value_sets": value_sets, "parser_sets": parser_sets,
    "env_vars": env_vars, "metrics_text": text,
}))
"""
)


def serve_options(serve) -> tuple[dict, list]:
    """Every option string the `vllm serve` parser `serve` ACCEPTS, with what the contract keeps of it, and its
    positionals. Runs inside the release's virtualenv (its source is pasted into INNER) and in the unit tests.

    What the parser accepts is its option-string table, not what help prints: vLLM 0.33.0's EnableDisableAction
    (vllm/utils/argparse_utils.py:120-145) pairs --enable-x with --disable-x and keeps --no-enable-x /
    --no-disable-x registered in `_option_string_actions`, while `_register_action` (:148-152) trims
    `action.option_strings` to the visible ones ("Hidden option strings stay registered with the parser but
    leave help"). argparse matches an argument against `_option_string_actions` (argparse.py
    `_parse_optional`), so that table is the contract; `hidden` marks the strings help does not print.
    """
    import ast  # noqa: PLC0415 - runs pasted into the recording script too

    def kind(action):
        name = type(action).__name__
        return {
            "_StoreAction": "store",
            "_StoreTrueAction": "store_true",
            "_StoreFalseAction": "store_false",
            "_StoreConstAction": "store_const",
            "_AppendAction": "append",
            "_CountAction": "count",
            "_HelpAction": "help",
            "_VersionAction": "version",
            "BooleanOptionalAction": "boolean_optional",
            "_ExtendAction": "extend",
        }.get(name, name)

    options, positionals = {}, []
    for action in serve._actions:
        if not action.option_strings:
            positionals.append({"dest": action.dest, "nargs": action.nargs})
    accepted_by_action = {}
    for opt, action in serve._option_string_actions.items():
        accepted_by_action.setdefault(id(action), (action, []))[1].append(opt)
    for action, accepted in accepted_by_action.values():
        longs = [o for o in accepted if o.startswith("--")]
        if not longs:
            raise SystemExit(f"option without a long form: {accepted}")
        visible = set(action.option_strings)
        takes_value = action.nargs != 0
        nargs = action.nargs if action.nargs not in (None, 0) else None
        choices = [str(c) for c in action.choices] if action.choices is not None else None
        typ = getattr(action.type, "__name__", None) if action.type is not None else None
        # optional_type(json.loads) / parse_type(int) (vllm/engine/arg_utils.py) wrap the real converter
        inner = None
        for cell in getattr(action.type, "__closure__", None) or ():
            if callable(cell.cell_contents):
                inner = getattr(cell.cell_contents, "__name__", None)
                break
        group = next((g.title for g in serve._action_groups if action in g._group_actions), None)
        # vllm/engine/arg_utils.py literal_to_kwargs: a field typed `Literal[...] | str` gets its Literal values
        # as the metavar, not as choices: they are the known values, and the option takes any other string too.
        metavar_values = None
        if isinstance(action.metavar, (list, tuple)):
            metavar_values = [str(v) for v in action.metavar]
        elif isinstance(action.metavar, str) and action.metavar.startswith("["):
            try:
                metavar_values = [str(v) for v in ast.literal_eval(action.metavar)]
            except (ValueError, SyntaxError):
                metavar_values = None
        for opt in longs:
            options[opt] = {
                "takes_value": takes_value,
                "choices": choices,
                "aliases": [o for o in accepted if o != opt],
                # accepted by the parser but not printed by --help (registered, then dropped from option_strings)
                "hidden": opt not in visible,
                "dest": action.dest,
                "action": kind(action),
                "nargs": nargs,
                "type": typ,
                "inner_type": inner,
                "group": group,
                "metavar_values": metavar_values,
            }
    return options, positionals


def inner_script() -> str:
    """INNER with serve_options' own source pasted in (one implementation, run in the release's virtualenv)."""
    return INNER.replace("__SERVE_OPTIONS_SOURCE__", inspect.getsource(serve_options))


def log(msg: str) -> None:
    print(f"[record_vllm_contract] {msg}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    log("$ " + " ".join(c if "\n" not in c else "<script>" for c in cmd))
    return subprocess.run(cmd, check=True, text=True, **kw)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(version: str, work: Path) -> Path:
    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        run([sys.executable, "-m", "pip", "download", f"vllm=={version}", "--no-deps", "-d", str(wheels), "-q"])
        found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        raise SystemExit(f"pip download vllm=={version} produced no wheel in {wheels}")
    return found[0]


def light_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    reqs = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req or SKIP_DEPS.match(req):
            continue
        reqs.append(req)
    return reqs


def venv_for(version: str, wheel: Path, work: Path) -> Path:
    venv = work / f"venv-{version}"
    py = venv / "bin" / "python"
    stamp = venv / ".sparkops-ready"
    if stamp.exists():
        return py
    if venv.exists():
        shutil.rmtree(venv)
    run([sys.executable, "-m", "venv", str(venv)])
    reqs = light_requirements(wheel)
    try:
        run([str(py), "-m", "pip", "install", "-q", TORCH, *reqs])
    except subprocess.CalledProcessError:
        # A release may pin versions newer than the index serves yet (e.g. certifi) or older than this
        # Python has wheels for: fall back to the packages by name. The parser and metrics code only
        # need them importable; the JSON's source.how says which way the virtualenv was made.
        names = sorted({re.match(r"^[A-Za-z0-9_.-]+(\[[^\]]*\])?", r).group(0) for r in reqs})  # extras kept
        log(f"pinned requirements did not install; installing {len(names)} by name")
        run([str(py), "-m", "pip", "install", "-q", TORCH, *names])
        (venv / ".sparkops-relaxed").write_text("requirements installed by name (pins unsatisfiable here)\n")
    run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)])
    stamp.write_text("ok\n")
    return py


# Families whose label values are this machine's or this recording's config, not part of the contract.
_CONFIG_LABELLED = (
    "vllm:cache_config_info",
    "python_info",
    "http_requests_total",
    "http_request_size_bytes",
    "http_response_size_bytes",
    "http_request_duration_seconds",
)


def parse_metrics(text: str) -> list[dict]:
    """Families from prometheus_client's text exposition: exposed name, type, help, labels, buckets."""
    fams: dict[str, dict] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            fams.setdefault(name, {"name": name, "labels": [], "buckets": None})["help"] = help_text
        elif line.startswith("# TYPE "):
            name, _, typ = line[7:].partition(" ")
            fams.setdefault(name, {"name": name, "labels": [], "buckets": None})["type"] = typ
        elif line and not line.startswith("#"):
            m = re.match(r"^([^{\s]+)(?:\{(.*)\})?\s", line)
            if not m:
                continue
            sample, labels = m.group(1), m.group(2) or ""
            fam = next(
                (
                    f
                    for f in (
                        sample,
                        *(
                            sample[: -len(s)]
                            for s in ("_bucket", "_sum", "_count", "_total", "_created")
                            if sample.endswith(s)
                        ),
                    )
                    if f in fams
                ),
                None,
            )
            if fam is None:
                continue
            names = re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', labels)
            if sample.endswith("_bucket"):
                le = re.search(r'le="([^"]*)"', labels)
                buckets = fams[fam]["buckets"] if fams[fam]["buckets"] is not None else []
                if le and le.group(1) not in buckets:
                    buckets.append(le.group(1))
                fams[fam]["buckets"] = buckets
                names = [n for n in names if n != "le"]
            if sample.endswith(("_sum", "_count", "_bucket", "_created")) and fams[fam].get("type") == "summary":
                names = [n for n in names if n != "quantile"]
            for n in names:
                if n not in fams[fam]["labels"]:
                    fams[fam]["labels"].append(n)
            # the children the release creates up front (finished_reason, sleep_state, source, ...)
            for n, v in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="([^"]*)"', labels):
                if n in ("engine", "model_name", "le", "quantile") or fam in _CONFIG_LABELLED:
                    continue
                seen = fams[fam].setdefault("label_values", {}).setdefault(n, [])
                if v not in seen:
                    seen.append(v)
    out = []
    for f in fams.values():
        # prometheus_client exposes a *_created gauge next to every counter/histogram/summary; it is a
        # sample of that family, not a family of its own.
        if f["name"].endswith("_created") and f["name"][: -len("_created")] in fams:
            continue
        if f["name"].endswith("_created") and f["name"][: -len("_created")] + "_total" in fams:
            continue
        family = (
            f["name"][: -len("_total")] if f.get("type") == "counter" and f["name"].endswith("_total") else f["name"]
        )
        out.append(
            {
                "name": f["name"],
                "family": family,
                "type": f.get("type", "untyped"),
                "labels": f["labels"],
                "help": f.get("help", ""),
                **({"buckets": f["buckets"]} if f["buckets"] else {}),
                **({"label_values": f["label_values"]} if f.get("label_values") else {}),
                "source": "vllm"
                if f["name"].startswith("vllm:")
                else ("prometheus_fastapi_instrumentator" if f["name"].startswith("http_") else "prometheus_client"),
            }
        )
    return sorted(out, key=lambda f: f["name"])


# --- --speculative-config: read from the release's config/speculative.py (static, no import) ----------


def _literal_values(node, aliases: dict) -> list[str]:
    """The strings of a `Literal[...]` annotation, following names bound to other Literals in the module."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, [])
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Literal":
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        out: list[str] = []
        for item in items:
            if isinstance(item, ast.Constant) and isinstance(item.value, str):
                out.append(item.value)
            else:
                out += _literal_values(item, aliases)
        return out
    return []


def speculative_from_source(text: str) -> dict:
    """What `--speculative-config` JSON a release takes, read from its vllm/config/speculative.py.

    The option's JSON becomes SpeculativeConfig(**json) (vllm/engine/arg_utils.py create_speculative_config),
    a pydantic dataclass that forbids unknown keys (vllm/config/utils.py `config`: extra="forbid"), so:
    `fields` are the keys it accepts (the class's annotated attributes, without the ones the engine fills
    in: target_*/draft_*_config), `methods` the values of its `method` Literal (SpeculativeMethod), and
    `aux_hidden_states_models` the target model types _verify_args lets eagle3 run on (a substring match
    on the target's model_type). Raises ValueError when the file has none of these (another layout).
    """
    tree = ast.parse(text)
    aliases: dict[str, list[str]] = {}
    cls = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values = _literal_values(node.value, aliases)
            if values:
                aliases[node.targets[0].id] = values
        if isinstance(node, ast.ClassDef) and node.name == "SpeculativeConfig":
            cls = node
    if cls is None:
        raise ValueError("no class SpeculativeConfig in the file")
    fields, method_annotation = [], None
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            if name.startswith(("target_", "draft_model_config", "draft_parallel_config")):
                continue  # filled in by the engine, not the option's JSON
            fields.append(name)
            if name == "method":
                method_annotation = node.annotation
    methods: list[str] = []
    if method_annotation is not None:
        for part in ast.walk(method_annotation):
            if isinstance(part, ast.Name) and part.id in aliases:
                methods += aliases[part.id]
    aux: list[str] = []
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "aux_hidden_states_supported"
            and isinstance(node.value, ast.List)
        ):
            aux = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    if not fields or not methods:
        raise ValueError("SpeculativeConfig has no annotated fields or no method Literal")
    return {
        "fields": sorted(fields),
        "methods": sorted(dict.fromkeys(methods)),
        "aux_hidden_states_models": aux,
        "source": "vllm/config/speculative.py (SpeculativeConfig, SpeculativeMethod, _verify_args), read with ast",
    }


def record(version: str, work: Path) -> dict:
    wheel = download(version, work)
    digest = sha256(wheel)
    py = venv_for(version, wheel, work)
    env = {**os.environ, "COLUMNS": "100", "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_CONFIGURE_LOGGING": "0"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    got = json.loads(run([str(py), "-c", inner_script()], capture_output=True, env=env).stdout.strip().splitlines()[-1])
    help_text = run([str(py), "-c", HELP, "serve", "--help=all"], capture_output=True, env=env).stdout
    version_text = run([str(py), "-c", HELP, "--version"], capture_output=True, env=env).stdout.strip()
    if version_text != version:
        raise SystemExit(f"`vllm --version` of the installed wheel says {version_text!r}, expected {version!r}")
    # Value sets: the parser's choices where the option has them (what `vllm serve` accepts), otherwise
    # the Literal/enum the config is typed with (e.g. --attention-backend takes a free string that the
    # engine looks up in AttentionBackendEnum).
    value_sets, enforcement = {}, {}
    for key, values in got["value_sets"].items():
        parsed = got["parser_sets"].get(key)
        value_sets[key] = sorted(parsed) if parsed else (sorted(values) if values is not None else None)
        # argparse choices make `vllm serve` exit 2 before anything starts; a value checked only by the
        # config (pydantic / ModelConfig._verify_quantization) fails later, at engine config, with exit 1.
        enforcement[key] = "argparse" if parsed else ("config" if values is not None else None)
    relaxed = (py.parent.parent / ".sparkops-relaxed").exists()
    contract = {
        "vllm_version": version,
        "source": {
            "wheel": wheel.name,
            "sha256": digest,
            "pypi": f"https://pypi.org/project/vllm/{version}/",
            "how": (
                "sim/record_vllm_contract.py: wheel installed --no-deps in a scratch virtualenv (CPU torch "
                f"{TORCH.split('==')[1]}, the wheel's pure-Python requirements); serve_options: every option string "
                "the release's own parser accepts (ServeSubcommand.subparser_init on a FlexibleArgumentParser, its "
                "_option_string_actions; `hidden` marks those help does not print); value_sets "
                "from the parser's choices, else the config Literal/enum; env_vars from "
                "vllm.envs.environment_variables; metrics from prometheus_client's exposition after the "
                "release's PrometheusStatLogger (default ObservabilityConfig/CacheConfig, no spec decoding, "
                "LoRA or KV connector) and attach_router (prometheus-fastapi-instrumentator) ran"
                + (
                    "; the wheel's version pins were not installable here, its requirements were installed by name"
                    if relaxed
                    else ""
                )
            ),
            "help_text": f"vllm-{version}.help.txt",
        },
        "serve_options": dict(sorted(got["options"].items())),
        "serve_positionals": got["positionals"],
        "value_sets": value_sets,
        "value_set_enforcement": enforcement,
        "env_vars": [n for n in got["env_vars"] if n.startswith("VLLM_")],
        # vllm/envs.py also reads some names outside VLLM_* (CUDA_VISIBLE_DEVICES, S3_*, ...); kept apart
        "other_env_vars": [n for n in got["env_vars"] if not n.startswith("VLLM_")],
        "metrics": parse_metrics(got["metrics_text"]),
        "speculative_config": speculative_from_source(_installed_speculative_py(py).read_text()),
    }
    return contract, help_text


def _installed_speculative_py(py: Path) -> Path:
    """vllm/config/speculative.py of the wheel installed in the scratch virtualenv of interpreter `py`."""
    found = sorted(py.parent.parent.glob("lib/python*/site-packages/vllm/config/speculative.py"))
    if not found:
        raise SystemExit(f"no vllm/config/speculative.py under {py.parent.parent}")
    return found[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", help="vLLM releases, e.g. 0.19.0 0.33.0")
    ap.add_argument("--work", type=Path, default=Path("/tmp/vllm-contract"), help="scratch dir (wheels, venvs)")
    ap.add_argument("--pinned", default="0.19.0", help="version whose fixture the test double carries")
    ap.add_argument("--standin-only", action="store_true", help="only rewrite sim/standin/vllm-contract.json")
    ap.add_argument(
        "--speculative-from",
        type=Path,
        metavar="VLLM_PKG_DIR",
        help="only add the speculative_config key to the fixture of the one version given, read from that "
        "release's unpacked package (e.g. /work/upstream/vllm-0.19.0/vllm), without re-recording the rest",
    )
    args = ap.parse_args()
    if args.speculative_from:
        if len(args.versions) != 1:
            ap.error("--speculative-from takes exactly one version")
        add_speculative(args.versions[0], args.speculative_from)
        if args.pinned == args.versions[0]:
            write_standin_copy(args.pinned)
        return 0
    CONTRACTS.mkdir(parents=True, exist_ok=True)
    for version in [] if args.standin_only else args.versions:
        contract, help_text = record(version, args.work)
        out = CONTRACTS / f"vllm-{version}.json"
        out.write_text(json.dumps(contract, indent=1, sort_keys=False) + "\n")
        (CONTRACTS / f"vllm-{version}.help.txt").write_text(help_text)
        log(
            f"{out.relative_to(ROOT)}: {len(contract['serve_options'])} options, {len(contract['env_vars'])} "
            f"VLLM_* variables, {len(contract['metrics'])} metric families ({contract['source']['wheel']})"
        )
    if args.pinned in args.versions or args.standin_only:
        write_standin_copy(args.pinned)
    return 0


def add_speculative(version: str, pkg_dir: Path) -> None:
    """Add (or refresh) the speculative_config key of an existing fixture from the release's own package."""
    out = CONTRACTS / f"vllm-{version}.json"
    contract = json.loads(out.read_text())
    stamp = pkg_dir / "_version.py"  # written by the wheel's build: __version__ = '0.19.0'
    if not stamp.is_file() or f"'{version}'" not in stamp.read_text():
        raise SystemExit(f"{stamp} does not say version {version}: point --speculative-from at that release")
    contract["speculative_config"] = speculative_from_source((pkg_dir / "config" / "speculative.py").read_text())
    out.write_text(json.dumps(contract, indent=1, sort_keys=False) + "\n")
    log(f"{out.relative_to(ROOT)}: speculative_config from {pkg_dir}/config/speculative.py")


def _standin_contract(version: str) -> str:
    contract = json.loads((CONTRACTS / f"vllm-{version}.json").read_text())
    contract["help_all"] = (CONTRACTS / f"vllm-{version}.help.txt").read_text()
    return json.dumps(contract, indent=1) + "\n"


def write_standin_copy(version: str) -> None:
    """sim/standin/vllm-contract.json: the fixture of `version` (the default stack's release) plus its raw
    help text (`help_all`), which the test double prints for `vllm serve --help=all`; and
    sim/standin/vllm-contract-<release>.json for every other recorded release, which the double loads when its
    image carries that release (a stack's own image: vLLM's reports the release itself). simctl copies
    sim/standin/* into the stand-in repository; its Dockerfile copies these files next to the double."""
    STANDIN_COPY.write_text(_standin_contract(version))
    log(f"wrote {STANDIN_COPY.relative_to(ROOT)} (vLLM {version}) for the test double")
    for release in sorted(p.name[len("vllm-") : -len(".json")] for p in CONTRACTS.glob("vllm-*.json")):
        if release == version:
            continue  # vllm-contract.json is that one already
        out = STANDIN_COPY.with_name(f"vllm-contract-{release}.json")
        out.write_text(_standin_contract(release))
        log(f"wrote {out.relative_to(ROOT)} (vLLM {release}) for the test double")


if __name__ == "__main__":
    sys.exit(main())
