#!/usr/bin/env python3
"""A stand-in for ``docker run`` that the weight_cache role's download runs through on this machine.

It does what docker does with the arguments the role passes, no more: ``-v HOST:CONTAINER[:ro]`` (the
command and ``-e`` values see HOST where they name CONTAINER), ``-e K=V`` (the only environment the
command gets besides the image's own: here the Hub client's PYTHONPATH and the endpoint, which the image
and the real Hub would supply), ``--rm``/``--network=host`` (nothing to do), then IMAGE and the command.
Unlike docker it records its argv in FAKE_DOCKER_LOG, so a test can show what a container's config
(`docker inspect`: Args, Env, Mounts) would hold. A ``:ro`` mount is not enforced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main() -> int:
    argv = sys.argv[1:]
    if not argv or argv[0] != "run":
        print(f"fake docker: only 'run' is supported, got {argv[:1]}", file=sys.stderr)
        return 125
    with open(os.environ["FAKE_DOCKER_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps(argv) + "\n")
    mounts, env, i = [], {}, 1
    while i < len(argv) and argv[i].startswith("-"):
        flag = argv[i]
        if flag in ("-v", "-e"):
            value = argv[i + 1]
            i += 2
            if flag == "-v":
                host, container = value.split(":")[:2]
                mounts.append((container, host))
            else:
                key, _, val = value.partition("=")
                env[key] = val if _ else os.environ.get(key, "")  # `-e NAME` copies the caller's value
        else:
            i += 1  # --rm, --network=host
    cmd = argv[i + 1 :]  # after the image

    def host_path(arg: str) -> str:
        for container, host in sorted(mounts, key=lambda m: -len(m[0])):
            if arg == container or arg.startswith(container + "/"):
                return host + arg[len(container) :]
        return arg

    cmd = [sys.executable if c == "python3" else host_path(c) for c in cmd]
    image_env = {
        k: os.environ[k] for k in ("PATH", "HF_ENDPOINT", "NO_PROXY", "HF_HUB_DISABLE_TELEMETRY") if k in os.environ
    }
    image_env["PYTHONPATH"] = os.environ["FAKE_DOCKER_PYTHONPATH"]
    image_env["HF_HOME"] = os.environ["FAKE_DOCKER_HF_HOME"]  # the image's own, inside the container
    image_env.update({k: host_path(v) for k, v in env.items()})
    return subprocess.run(cmd, env=image_env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
