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
# Read beside the versions; recorded in the lock file and compared with it exactly:
# - vllm_commit: the vLLM commit the build contains (from the version's +g<hash> label, else the commit
#   that setuptools-scm wrote into vllm/_version.py; the official 0.19.0 wheel's says 'g2a69949bd').
# - flashinfer_cutlass: the CUTLASS that FlashInfer compiles its JIT kernels against (the headers the
#   wheel ships under flashinfer/data/cutlass), as "<CUTLASS version>+sha256:<digest of the headers>".
#   eugr's Dockerfile@fc08740:95-114 checks a FlashInfer tag out WITHOUT updating its submodules on a
#   first build (cache miss) and WITH them on later ones, so the same --flashinfer-ref can carry two
#   CUTLASS trees under one FlashInfer version: the lock holds the first one's and refuses the other.
# - flashinfer_commit: the FlashInfer commit eugr's build-and-copy.sh wrote into the image's
#   /workspace/build-metadata.yaml (build-and-copy.sh@fc08740:48-76, :636-639; Dockerfile:346-347), from
#   `git rev-parse HEAD` after the FlashInfer build (Dockerfile:153). The same file's vllm_commit is the
#   last source of the vLLM commit (a full hash).
EXTRAS = ("vllm_commit", "flashinfer_commit", "flashinfer_cutlass")
# What sparkops_image_pins may name, and what the lock file may record.
PIN_KEYS = (*COMPONENTS, "vllm_commit", "flashinfer_cutlass")

# The CUTLASS each FlashInfer release ships, as the probe below reads it ("<version>+sha256:<16 hex>"): a
# build of that FlashInfer with any other CUTLASS is refused, and the lock never records one. Without
# this, eugr's FIRST build is the one locked, and it is the wrong one: on a cache miss eugr's
# Dockerfile@fc08740:97-103 clones FlashInfer `--recursive` at main (submodules at MAIN's commits) and
# checks the tag out without `git submodule update`; only the cache-hit branch (:110) updates them, and
# build-and-copy.sh@fc08740:505-506, :544-545 busts that step's cache on every build with --flashinfer-ref,
# so the SECOND build (the repository now in the repo-cache mount) is the correct one.
# 0.6.6: tag v0.6.6 is commit 70b142b75b46 (flashinfer/_build_meta.py of the flashinfer-python 0.6.6 wheel on
# PyPI); its 3rdparty/cutlass gitlink is NVIDIA/cutlass f3fde58372d3 (CUTLASS 4.2.1). This digest is that
# commit's include/ tree, computed with the probe's own walk, and equals the PyPI wheel's
# flashinfer/data/cutlass/include. FlashInfer's main on eugr's build day (a1166dc0, 2026-04-10) carries
# cutlass da5e086dab31 (4.4.2, since #2798 on 2026-03-19): "4.4.2+sha256:0c021aa4c41ed6dd", what a first
# build of fc08740 with --flashinfer-ref v0.6.6 ships.
FLASHINFER_OWN_CUTLASS = {
    "0.6.6": "4.2.1+sha256:2666672a2db624fd",
}
LOCK_KEYS = (*COMPONENTS, *EXTRAS)

PROBE = r"""
import hashlib, json, os, re
import importlib.metadata as md

def dist(*names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            pass
    return None

def package_file(dist_name, rel):
    try:
        path = md.distribution(dist_name).locate_file(rel)
    except md.PackageNotFoundError:
        return None
    return str(path) if os.path.exists(str(path)) else None

found = {
    "vllm": dist("vllm"),
    "torch": dist("torch"),
    "flashinfer": dist("flashinfer-python", "flashinfer"),
    "ray": dist("ray"),
    "cuda": os.environ.get("CUDA_VERSION") or None,
    "nccl": None,
    "vllm_commit": None,
    "flashinfer_commit": None,
    "flashinfer_cutlass": None,
}
meta = {}
meta_path = os.environ.get("SPARKOPS_BUILD_METADATA", "/workspace/build-metadata.yaml")
try:
    with open(meta_path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = re.match(r"^(vllm_commit|flashinfer_commit): *([0-9a-f]{7,40}) *$", line)
            if m:
                meta[m.group(1)] = m.group(2)
except OSError:
    pass
found["flashinfer_commit"] = meta.get("flashinfer_commit")
found["vllm_commit"] = meta.get("vllm_commit")
# setuptools-scm writes the commit it saw into vllm/_version.py (`__commit_id__ = commit_id = 'g...'`);
# read as text: importing vllm would import torch and take seconds.
version_py = package_file("vllm", "vllm/_version.py")
if version_py:
    with open(version_py, encoding="utf-8", errors="replace") as fh:
        m = re.search(r"^(?:__commit_id__ = )?commit_id = ['\"]g?([0-9a-f]{7,40})['\"]", fh.read(), re.M)
    if m:
        found["vllm_commit"] = m.group(1)
for fi in ("flashinfer-python", "flashinfer"):
    inc = package_file(fi, "flashinfer/data/cutlass/include")
    if inc:
        digest = hashlib.sha256()
        for root, dirs, files in os.walk(inc):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                digest.update(os.path.relpath(path, inc).encode() + b"\0")
                with open(path, "rb") as fh:
                    digest.update(hashlib.sha256(fh.read()).digest())
        ver = "unknown"
        try:
            with open(os.path.join(inc, "cutlass", "version.h"), encoding="utf-8", errors="replace") as fh:
                text = fh.read()
            parts = [re.search(r"#define CUTLASS_%s (\d+)" % k, text) for k in ("MAJOR", "MINOR", "PATCH")]
            if all(parts):
                ver = ".".join(p.group(1) for p in parts)
        except OSError:
            pass
        found["flashinfer_cutlass"] = ver + "+sha256:" + digest.hexdigest()[:16]
        break
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
    """The versions the probe printed; ValueError when its line is missing, not JSON or not a flat object.

    Every value must be a string or null: a line such as `null`, a list or a nested object is refused
    here, not turned into a crash in compare_versions or a lock file that records garbage.
    """
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                found = json.loads(line[len(MARKER) :])
            except ValueError as exc:
                raise ValueError(f"the probe's line is not JSON: {exc}") from None
            if not isinstance(found, dict):
                raise ValueError(f"the probe's line is not a JSON object but {type(found).__name__}")
            odd = sorted(k for k, v in found.items() if v is not None and not isinstance(v, str))
            if odd:
                raise ValueError(f"the probe's line has values that are not strings for {', '.join(odd)}")
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
    public = found.partition("+")[0]
    if public == pin:
        return True
    # Only further release numbers: ".0", ".1.2" (not ".", "..1", ".dev5" or "rc1").
    return public.startswith(pin) and re.fullmatch(r"(\.[0-9]+)+", public[len(pin) :]) is not None


# setuptools-scm's node-and-date local scheme writes the commit as the label's first part, "g" and the
# abbreviated hash (vcs_versioning _version_schemes/_standard.py get_local_node_and_date); vLLM's
# setup.py then adds ".cu132" after it (a dirty build at a tag: "0.19.1.dev0+g2a69949bd.d20260410.cu132").
_NODE_RE = re.compile(r"^g([0-9a-f]{7,40})$")


def vllm_commit(version: str | None, version_file_commit: str | None = None) -> str | None:
    """The vLLM commit a build contains: its version's +g<hash> label, else what vllm/_version.py says.

    A version without a +g label ("0.19.0", "0.19.0+cu132") is setuptools-scm's answer on a CLEAN
    checkout exactly at a tag; its commit then comes only from _version.py (the official 0.19.0 wheel's
    says g2a69949bd), or is unknown (None).
    """
    if version:
        label = str(version).strip().partition("+")[2]
        for part in label.split(".") if label else ():
            node = _NODE_RE.match(part)
            if node:
                return node.group(1)
    if version_file_commit:
        commit = str(version_file_commit).strip().lower()
        commit = commit[1:] if commit.startswith("g") else commit
        if re.fullmatch(r"[0-9a-f]{7,40}", commit):
            return commit
    return None


def same_commit(a: str, b: str) -> bool:
    """Two abbreviations (7-40 hex) of one commit: the shorter is a prefix of the longer."""
    a, b = str(a).strip().lower(), str(b).strip().lower()
    if len(a) < 7 or len(b) < 7:
        return False
    return a.startswith(b) or b.startswith(a)  # only the longer can start with the other


def vllm_problem(found: dict, pin_version: str | None, pin_commit: str | None) -> str | None:
    """Why the image's vLLM is not the pinned build (None when it is).

    With a commit pinned, identity is the commit: a build of that commit is accepted whatever its
    version string says (eugr's build edits the checkout before `uv build`, so setuptools-scm sees a
    dirty tree at the tag and reports the next dev version with +g<commit>.d<date>, and vLLM's setup.py
    adds the CUDA label). A build whose commit cannot be read (a plain "0.19.0" without _version.py's
    commit) is accepted when its version is exactly the pinned release (setuptools-scm gives the bare
    tag only on a clean checkout of the tag's commit); anything else is refused, naming both.
    """
    have = found.get("vllm")
    have_commit = vllm_commit(have, found.get("vllm_commit"))
    if pin_commit in (None, ""):
        if pin_version in (None, "") or version_matches(pin_version, have):
            return None
        return (
            f"vllm: the image carries {have if have is not None else 'none'}, the pin "
            f"(sparkops_image_pins.vllm) is {pin_version}"
        )
    want = f"{pin_version} at commit {pin_commit}" if pin_version not in (None, "") else f"commit {pin_commit}"
    where = "sparkops_image_pins.vllm_commit" + (", sparkops_image_pins.vllm" if pin_version not in (None, "") else "")
    if have_commit is not None:
        if same_commit(have_commit, pin_commit):
            return None
        return f"vllm: the image carries {have} (commit {have_commit}), the pin ({where}) is {want}"
    if have is not None and pin_version not in (None, "") and str(have).partition("+")[0] == str(pin_version).strip():
        return None
    return (
        f"vllm: the image carries {have if have is not None else 'none'} (commit unknown: no +g label, no commit in "
        f"vllm/_version.py), the pin ({where}) is {want}"
    )


def expected_cutlass(found: dict, pin: str | None = None) -> str | None:
    """The CUTLASS the image's FlashInfer must ship: the pin when set, else that release's own (None: unknown)."""
    if pin not in (None, ""):
        return str(pin).strip()
    version = found.get("flashinfer")
    return FLASHINFER_OWN_CUTLASS.get(str(version).strip().partition("+")[0]) if version else None


def cutlass_problem(found: dict, pin: str | None = None) -> str | None:
    """Why the CUTLASS headers FlashInfer ships are not its own (None when they are, or nothing is known).

    An image whose FlashInfer ships no headers at all (None) is not judged here: nothing of it can be
    JIT-compiled against the wrong CUTLASS (the compiled-module check judges what it carries).
    """
    want = expected_cutlass(found, pin)
    have = found.get("flashinfer_cutlass")
    if want is None or have is None or str(have) == want:
        return None
    where = (
        "sparkops_image_pins.flashinfer_cutlass"
        if pin not in (None, "")
        else f"FlashInfer {found.get('flashinfer')}'s own"
    )
    return (
        f"flashinfer_cutlass: the image's FlashInfer {found.get('flashinfer')} ships CUTLASS {have}, "
        f"not {want} ({where}). "
        "eugr's first build (FlashInfer not yet in its build cache) checks the FlashInfer tag out without updating "
        "its submodules, so it compiles against the CUTLASS of FlashInfer's main (Dockerfile@fc08740:97-103); a "
        "second build takes the cache-hit path, which updates them (:110)"
    )


def lock_record(found: dict) -> dict:
    """What the lock file records from a probe: the exact strings of LOCK_KEYS, the vLLM commit as judged."""
    record = {key: found.get(key) for key in LOCK_KEYS}
    record["vllm_commit"] = vllm_commit(found.get("vllm"), found.get("vllm_commit"))
    return record


# setuptools-scm's date label (".d20260410") is the day a dirty tree was BUILT (vcs_versioning
# _version_schemes/_standard.py get_local_node_and_date: the build time, not the commit's), so the same
# commit built again on another day carries another one. It says nothing about the code: the lock compares
# vLLM's version without it (the commit label and the CUDA label stay compared exactly).
_BUILD_DATE_RE = re.compile(r"^d[0-9]{8}$")


def lock_identity(component: str, value) -> str | None:
    """What the lock compares of a recorded value: the exact string, except vLLM's build-date label."""
    if value in (None, ""):
        return None
    text = str(value).strip()
    if component != "vllm" or "+" not in text:
        return text
    public, _plus, label = text.partition("+")
    kept = [part for part in label.split(".") if not _BUILD_DATE_RE.match(part)]
    return f"{public}+{'.'.join(kept)}" if kept else public


def compare_versions(found: dict, pins: dict, locked: dict | None = None) -> list[str]:
    """Problems (empty when the image is what was asked for), every component's, each naming both versions.

    pins: component -> pinned version or None (not pinned), and vllm_commit -> the vLLM commit the build
    must contain; locked: key -> exact value the lock file recorded (compared exactly, local labels
    included: the lock is a record, not a range). Every component is checked, so one run names every
    difference.
    """
    problems = []
    pins = pins or {}
    locked = locked or {}
    found = lock_record(found)
    for comp in LOCK_KEYS:
        have = found.get(comp)
        pin = pins.get(comp)
        if comp == "vllm":
            problem = vllm_problem(found, pin, pins.get("vllm_commit"))
        elif comp == "vllm_commit":
            problem = None  # judged with vllm above
        elif comp == "flashinfer_cutlass":
            problem = cutlass_problem(found, pin)
            if problem is None and have is not None and have == expected_cutlass(found, pin):
                # FlashInfer's own CUTLASS: a lock that recorded another one recorded a first build's
                # wrong headers, and it must not refuse the correct build.
                continue
        elif pin not in (None, "") and not version_matches(pin, have):
            problem = (
                f"{comp}: the image carries {have if have is not None else 'none'}, the pin "
                f"(sparkops_image_pins.{comp}) is {pin}"
            )
        else:
            problem = None
        if problem:
            problems.append(problem)
            continue  # the lock is not also named for a component the pin already refuses
        lock = locked.get(comp)
        if lock not in (None, "") and lock_identity(comp, lock) != lock_identity(comp, have):
            problems.append(
                f"{comp}: the image carries {have if have is not None else 'none'}, the lock file recorded {lock}"
            )
    unknown = sorted(set(pins) - set(PIN_KEYS))
    if unknown:
        problems.append(
            f"unknown components in sparkops_image_pins: {', '.join(unknown)} (known: {', '.join(PIN_KEYS)})"
        )
    return problems
