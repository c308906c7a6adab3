"""image_compiled: the in-image probe that loads vLLM's and FlashInfer's compiled code against the image's torch.

The probe runs for real (this Python) on a site-packages laid out as the packages install: a torch, a vllm whose
extension modules import or fail the way a compiled one does when torch's ABI moved (ImportError naming an
undefined symbol), and a FlashInfer that finds its AOT folder as 0.6.6 does (flashinfer/jit/env.py:97-124) and
loads each module with tvm_ffi.load_module (flashinfer/jit/core.py:306-307).
"""

from __future__ import annotations

import subprocess
import sys

from ansible_collections.sparkops.cluster.plugins.module_utils import image_compiled as ic

SKEW = "undefined symbol: _ZN3c1013MessageLoggerC1EPKciib"  # what a libtorch ABI change looks like at dlopen


def site(tmp_path, *, c_ok=True, moe=True, jit_cache=None, bad_so=()):
    root = tmp_path / "site"
    files = {
        "torch/__init__.py": "__version__ = '2.12.0.dev20260410+cu130'\n",
        "vllm/__init__.py": "",
        "vllm/_C.py": "import torch\n" + ("" if c_ok else f"raise ImportError({SKEW!r})\n"),
        "vllm/_C_stable_libtorch.py": "import torch\n",
        "flashinfer/__init__.py": "import torch\n",
        "flashinfer/jit/__init__.py": "",
    }
    if moe:
        files["vllm/_moe_C.py"] = "import torch\n"
    if jit_cache is None:
        files["flashinfer/jit/env.py"] = (
            "import pathlib\nFLASHINFER_AOT_DIR = pathlib.Path(__file__).parents[1] / 'data' / 'aot'\n"
        )
    else:
        aot = tmp_path / "jit_cache"
        for i, name in enumerate(jit_cache):
            (aot / "121a").mkdir(parents=True, exist_ok=True)
            (aot / "121a" / name).write_bytes(b"\x7fELF" + bytes([i]))
        files["flashinfer_jit_cache/__init__.py"] = f"def get_jit_cache_dir():\n    return {str(aot)!r}\n"
        files["flashinfer/jit/env.py"] = (
            "import pathlib, flashinfer_jit_cache\n"
            "FLASHINFER_AOT_DIR = pathlib.Path(flashinfer_jit_cache.get_jit_cache_dir())\n"
        )
        # tvm_ffi.load_module dlopens the file; the stand-in fails for the names given, as a skewed module would.
        files["tvm_ffi/__init__.py"] = (
            f"import os\nBAD = {sorted(bad_so)!r}\n"
            "def load_module(path):\n"
            "    if os.path.basename(path) in BAD:\n"
            f"        raise RuntimeError('Cannot load library: ' + path + ': {SKEW}')\n"
            "    return object()\n"
        )
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def run_probe(root) -> dict:
    res = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(root)!r}); exec({ic.PROBE!r})"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return ic.parse_output(res.stdout)


def test_an_image_whose_code_loads_has_no_problems(tmp_path):
    found = run_probe(site(tmp_path, jit_cache=["a.so", "b.so"]))
    assert ic.problems(found) == [], found
    assert found["vllm"] == {"vllm._C": "loaded", "vllm._C_stable_libtorch": "loaded", "vllm._moe_C": "loaded"}
    assert found["flashinfer_loaded"] == 2 and found["torch"] == "2.12.0.dev20260410+cu130"
    assert "loaded vllm._C" in ic.summary(found) and "2 FlashInfer" in ic.summary(found)


def test_a_vllm_extension_built_against_another_torch_is_refused_naming_the_symbol(tmp_path):
    found = run_probe(site(tmp_path, c_ok=False))
    problems = ic.problems(found)
    assert len(problems) == 1, problems
    assert problems[0].startswith("vllm._C does not load against the image's torch 2.12.0.dev20260410+cu130")
    assert SKEW in problems[0]


def test_a_flashinfer_module_that_does_not_load_is_refused(tmp_path):
    found = run_probe(site(tmp_path, jit_cache=["good.so", "bad.so"], bad_so=["bad.so"]))
    problems = ic.problems(found)
    assert len(problems) == 1 and "1 of FlashInfer's compiled modules" in problems[0], problems
    assert "121a/bad.so" in problems[0] and SKEW in problems[0]
    assert found["flashinfer_loaded"] == 1


def test_an_installed_jit_cache_with_nothing_to_load_is_a_problem(tmp_path):
    found = run_probe(site(tmp_path, jit_cache=[]))
    assert found["flashinfer_jit_cache"] is True
    assert [p for p in ic.problems(found) if "holds no compiled module" in p]


def test_optional_extensions_may_be_absent_but_vllm_c_may_not(tmp_path):
    root = site(tmp_path, moe=False)
    found = run_probe(root)
    assert ic.problems(found) == [] and found["vllm_missing"] == ["vllm._moe_C"]
    (root / "vllm" / "_C.py").unlink()
    problems = ic.problems(run_probe(root))
    assert problems and problems[0].startswith("vllm._C does not load") and "has no vllm._C" in problems[0]


def test_an_unreadable_result_is_an_error():
    for text in ("", "noise\n", ic.MARKER + "[]\n", ic.MARKER + "{\n"):
        try:
            ic.parse_output(text)
        except ValueError:
            continue
        raise AssertionError(f"accepted {text!r}")
