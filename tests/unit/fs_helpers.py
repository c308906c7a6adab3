"""Facts about the filesystem a test writes to."""

from __future__ import annotations

import ctypes

TMPFS_MAGIC = 0x01021994


class _Statfs(ctypes.Structure):
    # struct statfs starts with f_type (a long on Linux); the rest is not read.
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]


def on_tmpfs(path) -> bool:
    """tmpfs keeps its pages whatever posix_fadvise says (they are the file)."""
    buf = _Statfs()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(str(path).encode(), ctypes.byref(buf)) != 0:
        raise OSError(ctypes.get_errno(), f"statfs {path}")
    return buf.f_type == TMPFS_MAGIC
