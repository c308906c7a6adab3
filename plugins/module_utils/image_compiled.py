# Copyright: sparkops maintainers
# Apache-2.0
"""Whether a serving image's compiled code loads against the torch (and TVM-FFI) the image carries.

eugr's Dockerfile@fc08740 installs the newest cu130 NIGHTLY torch twice: in the builder (:53), where vLLM's
and FlashInfer's extensions are compiled, and again in the runner image (:314), where they run. Two nightlies
a build apart can differ in their C++ ABI; the version check (image_versions) reads only the runner's, so a
skew surfaced as an engine crash at the first start. This probe runs INSIDE the image, right after the build,
and loads what vLLM itself loads at start-up:

- vLLM's extensions: ``import vllm._C`` and ``import vllm._C_stable_libtorch`` are what vLLM 0.19.0's
  platforms/cuda.py:21-22 does on every CUDA start; ``vllm._moe_C`` when the build has it (the 0.19.0 wheel
  ships vllm/_C.abi3.so, _C_stable_libtorch.abi3.so and _moe_C.abi3.so). A torch ABI skew is an ImportError
  ("undefined symbol: ...") here.
- FlashInfer's compiled modules: FlashInfer 0.6.6 loads a prebuilt module from its AOT folder
  (flashinfer/jit/env.py:97-124: the flashinfer-jit-cache package's folder when installed, which eugr's
  Dockerfile@fc08740:150-151 builds) with ``tvm_ffi.load_module`` (flashinfer/jit/core.py:306-307). Every
  ``*.so`` there is loaded the same way. ``import flashinfer`` itself refuses a jit-cache of another version
  (env.py:104-119). The modules link ``-lcuda`` (flashinfer/jit/cpp_ext.py:221-227), so on a Spark the
  probe runs with the GPU (the driver's libcuda comes with it).
"""

from __future__ import annotations

import json

MARKER = "SPARKOPS-IMAGE-COMPILED "

# vLLM's extension modules the probe imports: the first is required, the others when the build has them.
VLLM_EXTENSIONS = ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C")

PROBE = r"""
import glob, importlib, importlib.util, json, os

def err(exc):
    return (type(exc).__name__ + ": " + str(exc))[:400]

out = {"torch": None, "vllm": {}, "vllm_missing": [], "flashinfer_aot_dir": None, "flashinfer_jit_cache": False,
       "flashinfer_loaded": 0, "flashinfer_failed": [], "errors": {}}
try:
    import torch
    out["torch"] = str(torch.__version__)
except Exception as exc:
    out["errors"]["torch"] = err(exc)
for i, name in enumerate(@EXTENSIONS@):
    try:
        present = importlib.util.find_spec(name) is not None
    except Exception as exc:
        out["errors"][name] = err(exc)
        continue
    if not present:
        if i == 0:
            out["errors"][name] = "ModuleNotFoundError: the image has no " + name
        else:
            out["vllm_missing"].append(name)
        continue
    try:
        importlib.import_module(name)
        out["vllm"][name] = "loaded"
    except Exception as exc:
        out["errors"][name] = err(exc)
try:
    out["flashinfer_jit_cache"] = importlib.util.find_spec("flashinfer_jit_cache") is not None
    import flashinfer  # noqa: F401
    from flashinfer.jit import env as fi_env
    aot = str(fi_env.FLASHINFER_AOT_DIR)
    out["flashinfer_aot_dir"] = aot
    found = sorted(glob.glob(os.path.join(aot, "**", "*.so"), recursive=True))
    if found:
        import tvm_ffi
        for path in found:
            try:
                tvm_ffi.load_module(path)
                out["flashinfer_loaded"] += 1
            except Exception as exc:
                out["flashinfer_failed"].append([os.path.relpath(path, aot), err(exc)])
except Exception as exc:
    out["errors"]["flashinfer"] = err(exc)
print(@MARKER@ + json.dumps(out, sort_keys=True))
""".replace("@EXTENSIONS@", repr(VLLM_EXTENSIONS)).replace("@MARKER@", repr(MARKER))


def parse_output(stdout: str) -> dict:
    """The probe's result; ValueError when its line is missing or not a JSON object."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                found = json.loads(line[len(MARKER) :])
            except ValueError as exc:
                raise ValueError(f"the compiled-code probe's line is not JSON: {exc}") from None
            if not isinstance(found, dict):
                raise ValueError("the compiled-code probe's line is not a JSON object")
            return found
    raise ValueError("the compiled-code probe printed no result line (did python3 in the image run it?)")


def problems(found: dict) -> list[str]:
    """Why the image's compiled code does not load against its torch (empty when it does)."""
    out = []
    torch = found.get("torch") or "none"
    errors = found.get("errors") or {}
    if "torch" in errors:
        out.append(f"torch does not import in the image: {errors['torch']}")
    for name in VLLM_EXTENSIONS:
        if name in errors:
            out.append(f"{name} does not load against the image's torch {torch}: {errors[name]}")
    if "flashinfer" in errors:
        out.append(f"FlashInfer does not import in the image (torch {torch}): {errors['flashinfer']}")
    failed = found.get("flashinfer_failed") or []
    if failed:
        first = "; ".join(f"{rel}: {why}" for rel, why in failed[:3])
        more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
        out.append(
            f"{len(failed)} of FlashInfer's compiled modules in {found.get('flashinfer_aot_dir')} do not load: "
            f"{first}{more}"
        )
    if (
        found.get("flashinfer_jit_cache")
        and not found.get("flashinfer_loaded")
        and not failed
        and "flashinfer" not in errors
    ):
        out.append(
            f"flashinfer-jit-cache is installed but {found.get('flashinfer_aot_dir')} holds no compiled module to load"
        )
    return out


def summary(found: dict) -> str:
    """One line for the play's output: what was loaded."""
    loaded = ", ".join(sorted(found.get("vllm") or {})) or "no vLLM extension"
    return (
        f"torch {found.get('torch') or 'none'}: loaded {loaded} and {found.get('flashinfer_loaded', 0)} FlashInfer "
        "compiled module(s)"
    )
