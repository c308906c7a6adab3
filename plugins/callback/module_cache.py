# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
name: module_cache
type: aggregate
short_description: Keep the modules Ansible packs for the nodes from one run to the next
description:
  - Before a module runs on a node, C(ansible-playbook) packs it with every C(module_utils) file it
    imports (AnsiballZ). Packing walks and compiles those files; Ansible keeps the result only for
    the run, in its per-run temporary folder, so every run packs each module it uses again. A no-op
    C(site.yml) on two nodes spends about 6 of its 38 seconds there (measured on 2 cores).
  - This callback points that per-run cache at a folder that outlives the run. The folder's name is
    a fingerprint of everything a packed module can contain, so that a changed file is packed anew,
    never taken from the cache; the fingerprint covers ansible-core's version and Python's,
    every file of the module and module_utils folders of collections not installed from a
    tarball (a source checkout such as this one), the C(MANIFEST.json) of every installed collection,
    and the files of the module and module_utils search paths and of C(library/) and
    C(module_utils/) folders next to the playbook and in the roles path.
  - An installed collection whose files are edited in place without reinstalling it keeps its
    C(MANIFEST.json), so its old modules could be used; remove the cache folders
    (C(~/.ansible/tmp/sparkops-ansiballz-*) by default) after such an edit.
  - The newest four folders are kept; older ones are removed when a run starts. Anything that fails
    here leaves Ansible's own per-run cache in place, so a run never depends on this callback.
  - It also puts compiled bytecode next to every Python file of a packed module (an unchecked hash-based
    C(.pyc), compiled by the controller's Python). A node imports the packed files from the zip (zipimport), which
    keeps no bytecode, so without it every task compiles C(ansible.module_utils.basic) and the rest again on the
    node, about half of a module's CPU time there (measured on 2 cores, C(benchmarks/module_bytecode.py)). A node
    whose Python is another minor version than the controller's ignores the bytecode (its magic number differs)
    and compiles the source as before. The packed modules are compiled as they appear in the cache, before the
    next task starts.
  - Enable it with C(callbacks_enabled = sparkops.cluster.module_cache) in C(ansible.cfg) (the
    checkout's ansible.cfg does).
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
requirements:
  - enable in C(callbacks_enabled)
"""

import base64
import binascii
import dataclasses
import glob
import hashlib
import importlib.util
import io
import marshal
import os
import pickle
import shutil
import sys
import zipfile

from ansible.plugins.callback import CallbackBase

# ansible-core keeps packed modules in <local tmp>/ansiballz_cache (executor/module_common.py,
# _find_module_utils) and removes the local tmp folder at exit; a link there is removed, not followed.
CACHE_NAME = "ansiballz_cache"
PREFIX = "sparkops-ansiballz-"
KEEP = 4


def _stat_line(path: str) -> str:
    st = os.stat(path)
    return f"{path}\0{st.st_size}\0{st.st_mtime_ns}"


def _files_under(folder: str) -> list[str]:
    lines = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        lines.extend(_stat_line(os.path.join(root, name)) for name in sorted(files))
    return lines


def collection_roots(collections_paths, python_path) -> list[str]:
    """Every ansible_collections folder the collection loader searches, in its order."""
    roots = [os.path.join(os.path.expanduser(p), "ansible_collections") for p in collections_paths]
    roots += [os.path.join(p or os.getcwd(), "ansible_collections") for p in python_path]
    seen: list[str] = []
    for root in roots:
        if os.path.isdir(root) and root not in seen:
            seen.append(root)
    return seen


def fingerprint(*, versions, collection_roots, legacy_folders) -> str:
    """A digest that changes whenever a module or module_utils file Ansible can pack may have changed."""
    lines = [repr(v) for v in versions]
    for root in collection_roots:
        for coll in sorted(glob.glob(os.path.join(root, "*", "*"))):
            manifest = os.path.join(coll, "MANIFEST.json")
            if os.path.isfile(manifest):
                lines.append(_stat_line(manifest))
                continue
            # A source checkout (no MANIFEST.json): its files themselves.
            for sub in ("modules", "module_utils"):
                lines.extend(_files_under(os.path.join(coll, "plugins", sub)))
    for folder in legacy_folders:
        if os.path.isdir(folder):
            lines.extend(_files_under(folder))
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()[:20]


def prune(parent: str, keep: int = KEEP) -> list[str]:
    """Remove all but the `keep` most recently used cache folders under parent; return what went."""
    found = []
    for path in glob.glob(os.path.join(parent, PREFIX + "*")):
        try:
            found.append((os.stat(path).st_mtime, path))
        except OSError:
            continue
    removed = []
    for _mtime, path in sorted(found, reverse=True)[keep:]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def attach(local_tmp: str, key: str) -> str | None:
    """Make <local_tmp>/ansiballz_cache a link to the kept folder for `key`; return that folder.

    Nothing is done (None) when Ansible has already made its own cache folder there.
    """
    link = os.path.join(local_tmp, CACHE_NAME)
    if os.path.lexists(link):
        return None
    parent = os.path.dirname(os.path.normpath(local_tmp))
    kept = os.path.join(parent, PREFIX + key)
    os.makedirs(kept, mode=0o700, exist_ok=True)
    os.utime(kept)  # most recently used: prune keeps it
    os.symlink(kept, link)
    return kept


def with_bytecode(payload: bytes) -> bytes | None:
    """The zip `payload` with each .py file's bytecode beside it (name.pyc), or None when it holds bytecode already.

    zipimport prefers name.pyc to name.py when the .pyc's magic number is its own Python's; the .pyc is hash-based
    and unchecked, so the zip entries' times do not matter. The source stays: another Python uses it as before.
    """
    src = zipfile.ZipFile(io.BytesIO(payload))
    infos = src.infolist()
    names = {info.filename for info in infos}
    if any(name.endswith(".pyc") for name in names):
        return None
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in infos:
            data = src.read(info)
            dst.writestr(info, data)
            if not info.filename.endswith(".py"):
                continue
            code = compile(data, info.filename, "exec", dont_inherit=True, optimize=0)
            flags = (0b01).to_bytes(4, "little")  # hash-based, source not checked (PEP 552)
            pyc = zipfile.ZipInfo(info.filename + "c", date_time=info.date_time)
            pyc.compress_type = zipfile.ZIP_DEFLATED
            header = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(data)
            dst.writestr(pyc, header + marshal.dumps(code))
    return out.getvalue()


def read_cached(path: str):
    """(record, payload) of one cached packed module: ansible-core 2.19 keeps a pickled record whose zip_data is the
    base64 payload (record returned), 2.17 and 2.18 the base64 payload alone (record None). ValueError when the
    file holds neither."""
    with open(path, "rb") as handle:
        data = handle.read()
    record = None
    if data[:1] == b"\x80":  # a pickle (protocol 2 or newer)
        record = pickle.loads(data)  # noqa: S301 - Ansible's own cache file, in a folder only this user can read
        data = record.zip_data
    try:
        return record, base64.b64decode(data, validate=True)
    except (binascii.Error, TypeError) as exc:
        raise ValueError(f"{path} holds no packed module") from exc


def add_bytecode(path: str) -> bool:
    """Rewrite one cached packed module with bytecode; True when it changed. The file is replaced in one rename,
    as Ansible writes it, so a worker reads either version."""
    try:
        record, payload = read_cached(path)
    except ValueError:
        return False
    compiled = with_bytecode(payload)
    if compiled is None:
        return False
    encoded = base64.b64encode(compiled)
    data = pickle.dumps(dataclasses.replace(record, zip_data=encoded)) if record is not None else encoded
    part = path + ".sparkops-part"
    with open(part, "wb") as handle:
        handle.write(data)
    os.replace(part, path)
    return True


def legacy_folders(playbook_base: str, module_paths, module_utils_paths, roles_paths) -> list[str]:
    folders = [os.path.expanduser(p) for p in list(module_paths) + list(module_utils_paths)]
    for base in [playbook_base] + [os.path.expanduser(p) for p in roles_paths] + [os.path.join(playbook_base, "roles")]:
        folders += [os.path.join(base, "library"), os.path.join(base, "module_utils")]
        folders += sorted(glob.glob(os.path.join(base, "*", "library")))
        folders += sorted(glob.glob(os.path.join(base, "*", "module_utils")))
    return folders


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sparkops.cluster.module_cache"
    CALLBACK_NEEDS_ENABLED = True
    # Ansible's cache folder for this run (set when the playbook starts), and each packed module's mtime when it
    # was last given bytecode (or found to need none).
    _cache_dir: str | None = None
    _compiled: dict | None = None

    def v2_playbook_on_start(self, playbook):
        try:
            from ansible import constants as C  # noqa: PLC0415, N812 - read when the run starts
            from ansible.release import __version__ as core_version  # noqa: PLC0415

            playbook_base = os.path.abspath(getattr(playbook, "_basedir", None) or os.getcwd())
            key = fingerprint(
                versions=(core_version, sys.version, CACHE_NAME),
                collection_roots=collection_roots(C.COLLECTIONS_PATHS, sys.path),
                legacy_folders=legacy_folders(
                    playbook_base, C.DEFAULT_MODULE_PATH, C.DEFAULT_MODULE_UTILS_PATH, C.DEFAULT_ROLES_PATH
                ),
            )
            kept = attach(C.DEFAULT_LOCAL_TMP, key)
            if kept:
                prune(os.path.dirname(kept))
                self._display.vvv(f"module_cache: packed modules kept in {kept}")
            self._cache_dir, self._compiled = os.path.join(C.DEFAULT_LOCAL_TMP, CACHE_NAME), {}
        except Exception as exc:  # noqa: BLE001 - a cache must never stop a run
            self._display.vvv(f"module_cache: not used ({exc})")
        self._compile_new()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._compile_new()

    def v2_playbook_on_handler_task_start(self, task):
        self._compile_new()

    def _compile_new(self) -> None:
        """Give bytecode to the packed modules that appeared (or changed) since the last look: a module packed by
        one task's workers is compiled before the next task's start."""
        folder, seen = self._cache_dir, self._compiled
        if folder is None or seen is None:
            return
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            if entry.name.endswith((".lock", "-part")) or not entry.is_file():
                continue
            try:
                mtime = entry.stat().st_mtime_ns
            except OSError:
                continue
            if seen.get(entry.name) == mtime:
                continue
            seen[entry.name] = mtime  # tried once per version of the file, whatever comes of it
            try:
                if add_bytecode(entry.path):
                    seen[entry.name] = os.stat(entry.path).st_mtime_ns
                    self._display.vvv(f"module_cache: bytecode added to {entry.name}")
            except Exception as exc:  # noqa: BLE001 - bytecode is an optimisation: the source stays usable
                self._display.vvv(f"module_cache: {entry.name} left as packed ({exc})")
