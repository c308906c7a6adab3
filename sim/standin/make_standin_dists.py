"""Write metadata-only STAND-IN distributions (vllm, torch, flashinfer-python) into site-packages.

Used only when building the sparkops simulated cluster's stand-in image. Each gets a dist-info
(so importlib.metadata reports the version, as for a real wheel) and a tiny package: `vllm` and
`torch` expose __version__, and torch.cuda.nccl.version() returns the NCCL version as a tuple, like
real torch; vllm._C / vllm._C_stable_libtorch import (after torch, as the compiled ones need), and
flashinfer.jit.env names an AOT folder without compiled modules. Nothing here computes; importing
anything else from them fails.
usage: make_standin_dists.py VLLM_VERSION VLLM_COMMIT FLASHINFER_VERSION TORCH_VERSION NCCL_VERSION

vllm is laid out as a setuptools-scm build installs it (the official 0.19.0 wheel, /work/upstream):
vllm/_version.py as vcs-versioning writes it (`__version__ = version = '...'`, `__commit_id__ = commit_id
= 'g<commit>'`), vllm/version.py importing it, vllm/__init__.py importing that (vllm/__init__.py:7), so
importlib.metadata, vllm.__version__ and the _version.py commit all give what a real build would.
"""

import sys
import sysconfig
from pathlib import Path

vllm_v, vllm_commit, flashinfer_v, torch_v, nccl_v = sys.argv[1:6]
site = Path(sysconfig.get_paths()["purelib"])
NOTE = '"""sparkops simulated cluster: a metadata-only STAND-IN, not the real package."""\n'


def dist(name: str, version: str, top: str, files: dict) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "INSTALLER").write_text("sparkops-standin\n")
    (info / "top_level.txt").write_text(top + "\n")
    for rel, text in files.items():
        path = site / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(NOTE + text)
    (info / "RECORD").write_text("".join(f"{rel},,\n" for rel in files))


nccl = tuple(int(p) for p in nccl_v.split("."))
dist(
    "vllm",
    vllm_v,
    "vllm",
    {
        "vllm/_version.py": f"__version__ = version = {vllm_v!r}\n__commit_id__ = commit_id = {'g' + vllm_commit!r}\n",
        "vllm/version.py": "from ._version import __version__  # noqa: F401\n",
        "vllm/__init__.py": "from .version import __version__  # noqa: F401\n",
        # The real build's compiled extensions (vllm/_C.abi3.so, _C_stable_libtorch.abi3.so in the 0.19.0 wheel)
        # need torch loaded; vLLM imports both at start-up (platforms/cuda.py:21-22) and so does the image
        # role's compiled-code check (module_utils/image_compiled.py). Stand-ins: Python, nothing compiled.
        "vllm/_C.py": "import torch  # noqa: F401\n",
        "vllm/_C_stable_libtorch.py": "import torch  # noqa: F401\n",
    },
)
dist(
    "torch",
    torch_v,
    "torch",
    {
        "torch/__init__.py": f"__version__ = {torch_v!r}\nfrom . import cuda  # noqa: E402\n",
        "torch/cuda/__init__.py": "from . import nccl  # noqa: F401\n",
        "torch/cuda/nccl.py": f"def version():\n    return {nccl!r}\n",
    },
)
# FlashInfer's AOT folder as 0.6.6 finds it without flashinfer-jit-cache (flashinfer/jit/env.py:97-124): the
# package's data/aot, which holds no compiled module here (the real image's jit-cache holds them).
dist(
    "flashinfer-python",
    flashinfer_v,
    "flashinfer",
    {
        "flashinfer/__init__.py": f"__version__ = {flashinfer_v!r}\n",
        "flashinfer/jit/__init__.py": "",
        "flashinfer/jit/env.py": (
            "import pathlib\n\nFLASHINFER_AOT_DIR = pathlib.Path(__file__).parents[1] / 'data' / 'aot'\n"
        ),
    },
)
