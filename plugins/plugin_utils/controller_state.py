"""The controller's state folder: where an older layout kept it, and moving it out of the inventory.

sparkops keeps the plan, the API key and the client keys, the lock file, the reports and the gateway's
wheelhouse in one folder beside the inventory (``sparkops_controller_state_dir``, default
``<inventory>-state``; plugin_utils/cluster.py ``controller_state_dir``). Older releases kept them inside
the inventory folder, where Ansible reads every file as an inventory source: ``credentials/api_key``
became a host of ``all`` and the plan's JSON 47 groups. ``legacy_moves`` lists what an older release left
there (pure); ``move`` moves each piece once (the first host's worker that gets there; the others find
it gone), never over something already in the new place.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil

# What an older release wrote inside the inventory folder, by the model's path that replaces it.
LEGACY = (
    ("credentials", "credentials_dir"),
    ("reports", "reports_dir"),
    ("sparkops.lock.json", "lock_file"),
    ("sparkops-plan.json", "plan_file"),
)


def _inside(path: str, folder: str) -> bool:
    path, folder = posixpath.normpath(path), posixpath.normpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def legacy_moves(paths: dict) -> list:
    """[(old, new)] for each piece of state whose old place is inside the inventory folder and whose new
    place (the model's `paths`) is another one, outside the inventory folder. Nothing is read here."""
    inventory = str(paths.get("inventory_dir") or "")
    if not inventory or inventory == ".":
        return []
    moves = []
    for name, key in LEGACY:
        old, new = posixpath.join(inventory, name), str(paths.get(key) or "")
        if new and posixpath.normpath(old) != posixpath.normpath(new) and not _inside(new, inventory):
            moves.append((old, new))
    credentials = str(paths.get("credentials_dir") or "")
    if credentials:
        # The gateway's default wheelhouse sits beside the credentials folder (sparkops_gateway_wheelhouse).
        new = posixpath.join(posixpath.dirname(posixpath.normpath(credentials)), "wheelhouse")
        old = posixpath.join(inventory, "wheelhouse")
        if posixpath.normpath(old) != posixpath.normpath(new) and not _inside(new, inventory):
            moves.append((old, new))
    return moves


def move(moves: list, *, check_mode: bool = False) -> tuple:
    """Moves each (old, new) that exists at `old` and not at `new`: (messages, pending), `pending` the
    moves check mode left undone (old -> new), for readers that must find the old file meanwhile."""
    messages, pending = [], {}
    for old, new in moves:
        if not os.path.lexists(old):
            continue
        if os.path.lexists(new):
            messages.append(
                f"{old} is left over inside the inventory folder, and {new} exists: sparkops uses {new}. Remove "
                f"{old} (Ansible reads every file of the inventory folder as inventory, a key as a host)."
            )
            continue
        if check_mode:
            pending[old] = new
            messages.append(f"would move {old} to {new} (check mode: nothing moved)")
            continue
        try:
            os.makedirs(posixpath.dirname(new) or ".", exist_ok=True)
            try:
                os.rename(old, new)  # atomic: of the hosts' workers, one moves it, the others find it gone
            except OSError as err:
                if err.errno != errno.EXDEV:
                    raise
                shutil.move(old, new)
        except FileNotFoundError:
            continue  # another host's worker moved it first
        except OSError as err:
            messages.append(f"could not move {old} to {new}: {err.strerror}; move it by hand")
            continue
        messages.append(
            f"moved {old} to {new}: the controller's state now lives beside the inventory, not in it "
            "(sparkops_controller_state_dir)"
        )
    return messages, pending


def make_private_dirs(paths: list) -> list:
    """Each missing folder of `paths` (and its missing parents) made with mode 0700; the ones made, in order."""
    made = []
    for path in dict.fromkeys(p for p in paths if p):
        missing = []
        at = os.path.abspath(path)
        while not os.path.isdir(at):
            missing.append(at)
            parent = os.path.dirname(at)
            if parent == at:
                break
            at = parent
        for folder in reversed(missing):
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                continue  # made meanwhile by another run
            os.chmod(folder, 0o700)  # whatever the umask
            made.append(folder)
    return made
