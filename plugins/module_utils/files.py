"""Files a module writes on the target, whole or not at all. Stdlib only (runs on the target, Python >= 3.10)."""

from __future__ import annotations

import os
import tempfile


def write_text_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text` at once: a temporary file in the same folder (created 0755 if missing), its mode
    set, then a rename; a reader sees the old file or the new one, never a part."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".sparkops-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
