# Copyright: sparkops maintainers
# Apache-2.0
"""Run a module_utils file's own code on another node over ssh, installing nothing there.

The one way sparkops runs its own Python on a node from another node (the image relay, the weight
sync's session): the file's source travels with the command and `python3 -c` runs it.

* ARGV_BOOT: the source, base64, in argv[1]; stdin stays free for data (the image relay's stream).
* stdin_boot(entry): the source, length-prefixed, first on stdin; stdin then stays the session's
  control channel (the weight sync's JSON lines), and `entry()` is the program's exit status.

The source is read once per process with inspect.getsource, which works from AnsiballZ's zip too.
"""

from __future__ import annotations

import base64
import functools
import inspect

ARGV_BOOT = "import base64,sys;exec(base64.b64decode(sys.argv[1]))"


@functools.cache
def source(module) -> bytes:
    """The module's own source, as it is shipped."""
    return inspect.getsource(module).encode()


def source_b64(module) -> str:
    """The module's source for ARGV_BOOT's argv[1]."""
    return base64.b64encode(source(module)).decode()


def stdin_boot(entry: str, name: str) -> str:
    """The `python3 -c` program that reads a length-prefixed source from stdin, runs it as module `name`
    (its tracebacks name `name`.py, and `ps`/`pkill -f` find the process by `name` on its command line)
    and exits with `entry()`'s return value."""
    return (
        "import sys;n=int(sys.stdin.buffer.readline());src=sys.stdin.buffer.read(n);"
        f"g={{'__name__':{name!r}}};exec(compile(src,{name + '.py'!r},'exec'),g);"
        f"raise SystemExit(g[{entry!r}]())"
    )


def stdin_preamble(module) -> bytes:
    """What stdin_boot reads first: the source's length on a line, then the source."""
    src = source(module)
    return str(len(src)).encode() + b"\n" + src
