"""Path filters for sparkops playbooks."""

from __future__ import annotations

import posixpath


def path_prefixes(path: str) -> list[str]:
    """Every directory a path lives under, itself included: '/a/b/' -> ['/', '/a', '/a/b'].

    Used to find the mount point that holds a path that may not exist yet
    (the longest mount point in this list).
    """
    norm = posixpath.normpath("/" + str(path).strip())
    parts = [p for p in norm.split("/") if p]
    out = ["/"]
    for i in range(len(parts)):
        out.append("/" + "/".join(parts[: i + 1]))
    return out


class FilterModule:
    def filters(self):
        return {"path_prefixes": path_prefixes}
