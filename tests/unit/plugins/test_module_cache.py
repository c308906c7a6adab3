"""module_cache keeps packed modules across runs: a changed file must never come from the cache.

The end-to-end test runs the real ansible-playbook twice with a module next to the playbook and
changes the module in between: the second run must run the new code. The others pin the pieces:
the fingerprint, the link Ansible's cleanup removes without following, and the pruning.
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.callback import module_cache

ROOT = Path(__file__).resolve().parents[3]
PLAYBOOK_BIN = Path(sys.executable).with_name("ansible-playbook")


def _zip(files: dict) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return out.getvalue()


def _replace(payload: bytes, name: str, data: bytes) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(payload))
    return _zip({i.filename: (data if i.filename == name else src.read(i)) for i in src.infolist()})


def _import_x(tmp_path: Path, payload: bytes) -> str:
    """What `pkg.mod.X` is when this Python imports it from the zip, as a node imports a packed module."""
    path = tmp_path / "payload.zip"
    path.write_bytes(payload)
    code = "import sys; sys.path.insert(0, sys.argv[1]); import pkg.mod; print(pkg.mod.X)"
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return res.stdout.strip()


def test_the_node_imports_the_bytecode_and_another_python_the_source(tmp_path):
    plain = _zip({"pkg/__init__.py": "", "pkg/mod.py": "from __future__ import annotations\nX = 1\n"})
    compiled = module_cache.with_bytecode(plain)
    names = zipfile.ZipFile(io.BytesIO(compiled)).namelist()
    assert sorted(names) == ["pkg/__init__.py", "pkg/__init__.pyc", "pkg/mod.py", "pkg/mod.pyc"]
    assert module_cache.with_bytecode(compiled) is None  # done once
    # The source changed under the bytecode: the import still gives the compiled X, so the .pyc is what ran.
    assert _import_x(tmp_path, _replace(compiled, "pkg/mod.py", b"X = 2\n")) == "1"
    # Bytecode of another Python (another magic number) is ignored: the source runs, as without this callback.
    pyc = zipfile.ZipFile(io.BytesIO(compiled)).read("pkg/mod.pyc")
    foreign = _replace(_replace(compiled, "pkg/mod.py", b"X = 2\n"), "pkg/mod.pyc", b"\x00\x00\r\n" + pyc[4:])
    assert _import_x(tmp_path, foreign) == "2"


def test_a_cached_module_of_either_format_is_rewritten_once(tmp_path):
    from ansible.executor.module_common import _CachedModule  # noqa: PLC0415 - ansible-core 2.19's record

    payload = _zip({"pkg/__init__.py": "", "pkg/mod.py": "X = 1\n"})
    record = tmp_path / "ansible.modules.mine-ZIP_DEFLATED-none"
    metadata = {"kept": "as it was"}
    record.write_bytes(
        pickle.dumps(_CachedModule(zip_data=base64.b64encode(payload), metadata=metadata, source_mapping={}))
    )
    assert module_cache.add_bytecode(str(record)) is True
    loaded = _CachedModule.load(str(record))
    assert loaded.metadata == metadata
    assert "pkg/mod.pyc" in zipfile.ZipFile(io.BytesIO(base64.b64decode(loaded.zip_data))).namelist()
    assert module_cache.add_bytecode(str(record)) is False
    # ansible-core 2.17 and 2.18 keep the base64 payload alone.
    older = tmp_path / "ansible.modules.mine-ZIP_DEFLATED"
    older.write_bytes(base64.b64encode(payload))
    assert module_cache.add_bytecode(str(older)) is True
    assert "pkg/mod.pyc" in zipfile.ZipFile(io.BytesIO(base64.b64decode(older.read_bytes()))).namelist()
    assert not list(tmp_path.glob("*-part"))


def _collection(root: Path, ns: str, name: str, manifest: bool) -> Path:
    coll = root / "ansible_collections" / ns / name
    (coll / "plugins" / "module_utils").mkdir(parents=True)
    (coll / "plugins" / "module_utils" / "helper.py").write_text("X = 1\n")
    if manifest:
        (coll / "MANIFEST.json").write_text("{}")
    return coll


def _key(tmp_path: Path, legacy=()) -> str:
    return module_cache.fingerprint(
        versions=("2.19", "3.11"),
        collection_roots=[str(tmp_path / "ansible_collections")],
        legacy_folders=[str(p) for p in legacy],
    )


def test_a_changed_source_file_or_manifest_or_version_changes_the_fingerprint(tmp_path):
    source = _collection(tmp_path, "src", "coll", manifest=False)
    installed = _collection(tmp_path, "inst", "coll", manifest=True)
    first = _key(tmp_path)
    assert _key(tmp_path) == first  # stable while nothing changes

    helper = source / "plugins" / "module_utils" / "helper.py"
    helper.write_text("X = 22\n")
    second = _key(tmp_path)
    assert second != first

    # An installed collection is known by its MANIFEST.json (reinstalling rewrites it).
    os.utime(installed / "MANIFEST.json", ns=(0, 10**9))
    third = _key(tmp_path)
    assert third != second

    library = tmp_path / "library"
    library.mkdir()
    (library / "mine.py").write_text("print(1)\n")
    assert _key(tmp_path, [library]) != third
    assert (
        module_cache.fingerprint(
            versions=("2.20", "3.11"), collection_roots=[str(tmp_path / "ansible_collections")], legacy_folders=[]
        )
        != third
    )


def test_the_link_is_removed_with_the_run_and_the_kept_folder_stays(tmp_path):
    local_tmp = tmp_path / "tmp" / "ansible-local-1abc"
    local_tmp.mkdir(parents=True)
    kept = module_cache.attach(str(local_tmp), "k1")
    assert kept == str(tmp_path / "tmp" / "sparkops-ansiballz-k1")
    (Path(kept) / "ansible.modules.ping-ZIP_DEFLATED-none").write_text("packed")
    assert (local_tmp / "ansiballz_cache" / "ansible.modules.ping-ZIP_DEFLATED-none").read_text() == "packed"
    # A second playbook of the same run finds the link: nothing changes.
    assert module_cache.attach(str(local_tmp), "k2") is None
    shutil.rmtree(local_tmp)  # what ansible-playbook does at exit
    assert (Path(kept) / "ansible.modules.ping-ZIP_DEFLATED-none").read_text() == "packed"


def test_prune_keeps_the_most_recently_used_folders(tmp_path):
    now = time.time()
    for i in range(6):
        path = tmp_path / f"sparkops-ansiballz-{i}"
        path.mkdir()
        os.utime(path, (now - 100 * i, now - 100 * i))
    (tmp_path / "ansible-local-x").mkdir()
    removed = module_cache.prune(str(tmp_path), keep=4)
    assert sorted(Path(p).name for p in removed) == ["sparkops-ansiballz-4", "sparkops-ansiballz-5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ansible-local-x",
        *(f"sparkops-ansiballz-{i}" for i in range(4)),
    ]


MODULE = """#!/usr/bin/python
from ansible.module_utils.basic import AnsibleModule
AnsibleModule(argument_spec={}).exit_json(changed=False, answer=%d)
"""
PLAYBOOK = """- hosts: localhost
  gather_facts: false
  tasks:
    - mine: {}
      register: got
    - debug: {msg: "ANSWER={{ got.answer }}"}
"""


@pytest.mark.skipif(not PLAYBOOK_BIN.exists(), reason="ansible-playbook is not next to this Python")
def test_a_module_changed_between_two_runs_runs_its_new_code(tmp_path):
    (tmp_path / "library").mkdir()
    (tmp_path / "site.yml").write_text(PLAYBOOK)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ltmp"),
        "ANSIBLE_CALLBACKS_ENABLED": "sparkops.cluster.module_cache",
    }

    def run(answer: int, write: bool = True) -> str:
        if write:
            (tmp_path / "library" / "mine.py").write_text(MODULE % answer)
        res = subprocess.run(
            [
                str(PLAYBOOK_BIN),
                "-i",
                "localhost,",
                "-c",
                "local",
                "-e",
                json.dumps({"ansible_python_interpreter": sys.executable}),
                "-vvv",
                "site.yml",
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        assert "module_cache: packed modules kept in" in res.stdout, res.stdout[-3000:]
        return res.stdout

    first = run(1)
    assert "ANSWER=1" in first
    # The module packed by the first task had bytecode before the next task started.
    assert "module_cache: bytecode added to ansible.legacy.mine-" in first, first[-3000:]
    kept = sorted((tmp_path / "ltmp").glob("sparkops-ansiballz-*"))
    assert len(kept) == 1 and any(kept[0].iterdir())  # the packed modules outlived the run
    # The same module again: it runs from the cached payload, bytecode and all, and adds nothing.
    again = run(1, write=False)
    assert "ANSWER=1" in again and "bytecode added" not in again, again[-3000:]
    assert "ANSWER=2" in run(2)
    assert len(sorted((tmp_path / "ltmp").glob("sparkops-ansiballz-*"))) == 2
