# Copyright: sparkops maintainers
# Apache-2.0
"""The image fan-out's relay: what every node on the way runs (image_fanout.py plans the hops).

A real file, shipped with the collection and checked like the rest of its code, but never imported on
a node: image_fanout sends (remote_exec.source_b64) this file's own source in the ssh command (base64, run by
`python3 -c`), so nothing is installed there. argv: CODE_B64 NODE SPEC_B64. It pipes stdin to
`zstd -d | docker load` (when this node lacks the image) and, at the same time, to one ssh per child
that runs the same relay there with the same CODE_B64; it prints one JSON report (its load, each
child's report with the hop's exit status and stderr). Python 3.8+ standard library only (whatever
python3 the node has), so no import from the collection either.
"""

import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

try:
    import fcntl
except ImportError:  # not Linux: the pipes keep their default size
    fcntl = None

# The python3 -c program that runs a relay passed as base64 in argv[1] (remote_exec.ARGV_BOOT: the same
# string, repeated here because this file runs alone on a node and imports nothing of the collection).
ARGV_BOOT = "import base64,sys;exec(base64.b64decode(sys.argv[1]))"


def tail(f, n=1500):
    f.seek(0)
    return f.read().decode("utf-8", "replace")[-n:].strip()


def write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def main():
    code_b64, node, spec_b64 = sys.argv[1], sys.argv[2], sys.argv[3]
    spec = json.loads(base64.b64decode(spec_b64))
    deadline = time.monotonic() + float(spec["timeout_s"])
    procs = []
    report = {"node": node, "load": None, "bytes": 0, "children": []}

    def on_timeout():
        for p in procs:
            with contextlib.suppress(OSError):
                p.kill()
        report["timeout"] = True
        sys.stdout.write(json.dumps(report) + "\n")
        sys.stdout.flush()
        os._exit(124)

    timer = threading.Timer(float(spec["timeout_s"]), on_timeout)
    timer.daemon = True
    timer.start()
    sinks = []
    if node in spec["load"]:
        env = dict(os.environ, SPARKOPS_FANOUT_NODE=node)
        # The files and processes live until the report below (the process exits right after it).
        unz_err, load_out, load_err = (tempfile.TemporaryFile() for _unused in range(3))  # noqa: SIM115
        unz = subprocess.Popen(["zstd", "-q", "-d"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=unz_err)  # noqa: SIM115
        load = subprocess.Popen(  # noqa: SIM115
            [spec["docker"], "load", "-q"], stdin=unz.stdout, stdout=load_out, stderr=load_err, env=env
        )
        unz.stdout.close()
        procs += [unz, load]
        sinks.append(
            {
                "kind": "load",
                "proc": unz,
                "fd": unz.stdin.fileno(),
                "error": None,
                "bytes": 0,
                "files": (unz_err, load_out, load_err),
                "load": load,
            }
        )
    for child in spec["children"].get(node, []):
        remote = " ".join(shlex_quote(a) for a in [spec["python"], "-c", ARGV_BOOT, code_b64, child, spec_b64])
        argv = list(spec["ssh"]) + [spec["user"] + "@" + spec["ip"][child], remote]
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 - read by the report below
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err)  # noqa: SIM115
        procs.append(proc)
        sinks.append(
            {
                "kind": "child",
                "to": child,
                "proc": proc,
                "fd": proc.stdin.fileno(),
                "error": None,
                "bytes": 0,
                "files": (out, err),
            }
        )
    for s in sinks:
        if fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.fcntl(s["fd"], 1031, 1 << 20)  # F_SETPIPE_SZ: fewer stalls between the sinks
    # Read to the end even when every sink failed: the hop into this node did not fail.
    while True:
        chunk = os.read(0, 1 << 20)
        if not chunk:
            break
        report["bytes"] += len(chunk)
        for s in sinks:
            if s["error"] is None:
                try:
                    write_all(s["fd"], chunk)
                    s["bytes"] += len(chunk)
                except OSError as exc:
                    s["error"] = f"the stream broke after {s['bytes']} bytes: {exc}"
    for s in sinks:
        with contextlib.suppress(OSError):
            s["proc"].stdin.close()
    for s in sinks:
        left = max(1.0, deadline - time.monotonic())
        if s["kind"] == "load":
            unz_rc = s["proc"].wait(timeout=left)
            load_rc = s["load"].wait(timeout=max(1.0, deadline - time.monotonic()))
            unz_err, load_out, load_err = s["files"]
            report["load"] = {
                "ok": unz_rc == 0 and load_rc == 0 and s["error"] is None,
                "zstd_rc": unz_rc,
                "rc": load_rc,
                "stdout": tail(load_out, 500),
                "stderr": (tail(unz_err, 700) + "\n" + tail(load_err, 700)).strip(),
                "error": s["error"],
            }
        else:
            rc = s["proc"].wait(timeout=left)
            out, err = s["files"]
            child_report = None
            for line in reversed(tail(out, 10**7).splitlines()):
                try:
                    child_report = json.loads(line)
                    break
                except ValueError:
                    continue
            report["children"].append(
                {
                    "from": node,
                    "to": s["to"],
                    "ip": spec["ip"][s["to"]],
                    "rc": rc,
                    "bytes": s["bytes"],
                    "error": s["error"],
                    "stderr": tail(err),
                    "report": child_report,
                }
            )
    timer.cancel()
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


def shlex_quote(s):
    return "'" + s.replace("'", "'\"'\"'") + "'"


if __name__ == "__main__":
    main()
