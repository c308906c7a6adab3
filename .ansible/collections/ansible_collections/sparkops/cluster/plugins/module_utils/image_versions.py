# Copyright: sparkops maintainers
# Apache-2.0
"""What a serving image carries (vLLM, torch, CUDA, FlashInfer, Ray, NCCL) and whether that is what was pinned.

The probe runs INSIDE the image with the image's own python3, so it reports the packages vLLM will
really import, not the host's. It only uses public APIs: importlib.metadata for the wheels, the
CUDA_VERSION variable that NVIDIA's CUDA base images set (or /usr/local/cuda/version.json), and
torch.cuda.nccl.version() for the NCCL library torch loads (eugr's image links torch's libnccl to the
NCCL it built, Dockerfile@fc08740:343-344).
"""

from __future__ import annotations

import json
import re

COMPONENTS = ("vllm", "torch", "cuda", "flashinfer", "ray", "nccl")

PROBE = r"""
import json, os
import importlib.metadata as md

def dist(*names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            pass
    return None

found = {
    "vllm": dist("vllm"),
    "torch": dist("torch"),
    "flashinfer": dist("flashinfer-python", "flashinfer"),
    "ray": dist("ray"),
    "cuda": os.environ.get("CUDA_VERSION") or None,
    "nccl": None,
}
if found["cuda"] is None:
    try:
        with open("/usr/local/cuda/version.json") as fh:
            found["cuda"] = json.load(fh)["cuda"]["version"]
    except (OSError, KeyError, ValueError):
        pass
try:
    import torch
    v = torch.cuda.nccl.version()
    found["nccl"] = ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)
except Exception as exc:
    found["nccl_error"] = type(exc).__name__ + ": " + str(exc)[:200]
print("SPARKOPS-IMAGE-VERSIONS " + json.dumps(found, sort_keys=True))
"""

MARKER = "SPARKOPS-IMAGE-VERSIONS "


def parse_probe_output(stdout: str) -> dict:
    """The versions the probe printed; ValueError when its line is missing or not JSON."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                found = json.loads(line[len(MARKER) :])
            except ValueError as exc:
                raise ValueError(f"the probe's line is not JSON: {exc}") from None
            if not isinstance(found, dict):
                raise ValueError("the probe's line is not a JSON object")
            return found
    raise ValueError("the probe printed no versions line (did python3 in the image run it?)")


def version_matches(pin: str, found: str | None) -> bool:
    """A pin matches the same version, or a longer one that only adds release numbers or a local label.

    "13.2" matches "13.2.0" and "13.2.1"; "0.19.0" matches "0.19.0+cu132" (vLLM's setup.py adds the
    CUDA as a local label) but NOT "0.19.0.dev5", "0.19.0rc1" or "0.19.1".
    """
    if found is None:
        return False
    pin = str(pin).strip()
    found = str(found).strip()
    if found == pin:
        return True
    public = found.split("+", 1)[0]
    if public == pin:
        return True
    if public.startswith(pin + "."):
        return re.fullmatch(r"[0-9.]+", public[len(pin) + 1 :]) is not None
    return False


def compare_versions(found: dict, pins: dict, locked: dict | None = None) -> list[str]:
    """Problems (empty when the image is what was asked for), each naming the component, both versions and the source.

    pins: component -> pinned version or None (not pinned); locked: component -> exact version the lock
    file recorded (compared exactly, local labels included: the lock is a record, not a range).
    """
    problems = []
    locked = locked or {}
    for comp in COMPONENTS:
        have = found.get(comp)
        pin = pins.get(comp)
        if pin not in (None, "") and not version_matches(pin, have):
            problems.append(
                f"{comp}: the image carries {have if have is not None else 'none'}, the pin "
                f"(sparkops_image_pins.{comp}) is {pin}"
            )
            continue
        lock = locked.get(comp)
        if lock not in (None, "") and str(lock) != str(have):
            problems.append(
                f"{comp}: the image carries {have if have is not None else 'none'}, the lock file recorded {lock}"
            )
    unknown = sorted(set(pins) - set(COMPONENTS))
    if unknown:
        problems.append(
            f"unknown components in sparkops_image_pins: {', '.join(unknown)} (known: {', '.join(COMPONENTS)})"
        )
    return problems
