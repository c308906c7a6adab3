"""The gateway's LiteLLM proxy configuration, rendered from the serving plan (issue 25; docs/gateway.md).

Pure, controller side: plugins/plugin_utils/serving.py's plan in, LiteLLM 1.108.7's config.yaml as a dict out.
One model_list entry per replica endpoint, all replicas of a deployment under its served model name (LiteLLM's
router spreads a model name's entries and cools a failing one down); no master key and no DATABASE_URL
(LiteLLM's key database needs Prisma, which downloads its engines: not on an air-gapped head); client keys
through our custom-auth hook (roles/gateway/files/sparkops_gateway_auth.py); usage through LiteLLM's
Prometheus integration plus our callback.
"""

from __future__ import annotations

AUTH_MODULE = "sparkops_gateway_auth"
# The env var, in the gateway's service, that holds the key the gateway presents to vLLM (the deployment's
# sparkops_vllm_auth key): LiteLLM reads `os.environ/NAME` values at start (litellm/proxy/proxy_server.py).
VLLM_KEY_ENV = "SPARKOPS_VLLM_API_KEY"
ROUTER_DEFAULTS = {
    # A random replica per request, weighted equally: no Redis needed (usage-based strategies want one).
    "routing_strategy": "simple-shuffle",
    # The first failure cools the replica down for cooldown_time seconds (litellm/router_utils/
    # cooldown_handlers.py:546-551: cooled when fails this minute > allowed_fails); a retry goes to another.
    "allowed_fails": 0,
    "cooldown_time": 30,
    "num_retries": 2,
    "retry_after": 0,
    "timeout": 600,
}


def replica_id(deployment: str, index: int) -> str:
    """The gateway's name for a replica (model_info.id; what sparkops_gateway_drained lists)."""
    return f"{deployment}-{index}"


class GatewayPlanError(ValueError):
    """The serving plan gives the gateway nothing to route to, or two deployments one name."""


def replicas(deployment: dict) -> list[dict]:
    """The API endpoints of a deployment: `replicas[]` when the plan has them, else its one endpoint."""
    reps = deployment.get("replicas")
    if reps:
        # The serving plan names a replica's API node `head`.
        return [{"host": r["head"], "url": r["endpoint"]["url"]} for r in reps]
    return [{"host": deployment["api_host"], "url": deployment["endpoint"]["url"]}]


def model_list(plan: dict) -> list[dict]:
    entries, seen = [], {}
    for dep in plan.get("deployments") or []:
        name = dep["served_model_name"]
        if name in seen:
            raise GatewayPlanError(
                f"deployments {seen[name]!r} and {dep['name']!r} both serve {name!r}: "
                "give each deployment its own served_model_name"
            )
        seen[name] = dep["name"]
        for index, rep in enumerate(replicas(dep)):
            entries.append(
                {
                    "model_name": name,
                    "litellm_params": {
                        # hosted_vllm: LiteLLM's OpenAI-compatible provider for vLLM (passes vLLM's params through).
                        "model": f"hosted_vllm/{name}",
                        "api_base": rep["url"].rstrip("/") + "/v1",
                        "api_key": f"os.environ/{VLLM_KEY_ENV}",
                    },
                    "model_info": {"id": replica_id(dep["name"], index), "sparkops_host": rep["host"]},
                }
            )
    if not entries:
        raise GatewayPlanError("the serving plan has no deployment: nothing for the gateway to route to")
    return entries


def drain(entries: list[dict], drained=()) -> list[dict]:
    """`entries` without the replicas whose model_info.id is in `drained` (a blue-green switch takes a replica
    out of the gateway's routing before it is stopped). Refused, naming what is wrong, when an id names no
    replica or when a served model would be left without any replica (its clients would get errors)."""
    drained = [str(d) for d in (drained or ())]
    ids = [e["model_info"]["id"] for e in entries]
    unknown = sorted(set(drained) - set(ids))
    if unknown:
        raise GatewayPlanError(
            f"drained replica(s) {', '.join(unknown)} are not in the plan: the replicas are {', '.join(ids)} "
            "(<deployment>-<index>)"
        )
    kept = [e for e in entries if e["model_info"]["id"] not in drained]
    served = {e["model_name"] for e in kept}
    emptied = [name for name in dict.fromkeys(e["model_name"] for e in entries) if name not in served]
    if emptied:
        raise GatewayPlanError(
            f"draining {', '.join(sorted(drained))} would leave {', '.join(emptied)} with no replica to route to: "
            "start its new replica (or keep one) before draining the last one"
        )
    return kept


def litellm_config(plan: dict, router: dict | None = None, drained=()) -> dict:
    return {
        "model_list": drain(model_list(plan), drained),
        "router_settings": {**ROUTER_DEFAULTS, **(router or {})},
        "litellm_settings": {
            "callbacks": ["prometheus", f"{AUTH_MODULE}.usage_callback"],
            # /metrics behind the key as well (litellm/__init__.py:194 defaults it on; said here so it stays).
            "require_auth_for_metrics_endpoint": True,
            "drop_params": False,
            # No `telemetry` key: 1.108.7 sets any unknown litellm_settings key as an attribute of litellm
            # (litellm/proxy/proxy_server.py:6737-6745) that nothing reads; its telemetry is read from the
            # environment (LITELLM_TELEMETRY_DISABLED: roles/gateway/vars/main.yml).
        },
        "general_settings": {
            "custom_auth": f"{AUTH_MODULE}.user_api_key_auth",
            "disable_spend_logs": True,
            # No `disable_admin_ui` key: 1.108.7 reads only the environment's DISABLE_ADMIN_UI
            # (litellm/proxy/common_utils/admin_ui_utils.py:7-8), set in roles/gateway/vars/main.yml.
        },
    }


# ------------------------------------------------------------------------------- the keys' usage
# What plugins/module_utils/gateway_keys.py's usage() gives per key (names, counters, class and limits, never a key).
COUNT_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "refused")
USAGE_FIELDS = ("name", "state", *COUNT_FIELDS, "key_class", "max_parallel_requests", "tpm_limit")


def limit_text(row: dict) -> str:
    """`CLASS, N parallel[, T tokens/min]` ("no parallel limit" when the key has none)."""
    parallel, tpm = row.get("max_parallel_requests"), row.get("tpm_limit")
    text = f"{row.get('key_class') or 'interactive'}, " + (
        f"{int(parallel)} parallel" if parallel is not None else "no parallel limit"
    )
    return text + (f", {int(tpm)} tokens/min" if tpm is not None else "")


def usage_lines(keys: list) -> list[str]:
    """One line per key of the gateway_key module's `keys` (playbooks/keys.yml's list, status's keys section):
    `NAME: STATE, CLASS, N parallel[, T tokens/min], R requests, P prompt and C completion tokens, X refused (429)`,
    by name. Only
    those fields are read, so a key or digest that a future usage() added could not reach a line; a row without
    one of them is an error."""
    lines = []
    for row in sorted(keys or [], key=lambda r: str(r.get("name", "")) if isinstance(r, dict) else ""):
        missing = [f for f in USAGE_FIELDS if not isinstance(row, dict) or f not in row]
        if missing:
            raise ValueError(f"a key's usage row lacks {', '.join(missing)}")
        counts = {f: int(row[f]) for f in COUNT_FIELDS}
        lines.append(
            f"{row['name']}: {row['state']}, {limit_text(row)}, {counts['requests']} requests, "
            f"{counts['prompt_tokens']} prompt and {counts['completion_tokens']} completion tokens, "
            f"{counts['refused']} refused (429)"
        )
    return lines


# ------------------------------------------------------------------------------- the offline wheelhouse
# PEP 600 manylinux tags from glibc 2.17 (manylinux2014's base) up: pip's --platform takes exact tags, so a
# download for another machine names every level the node's glibc runs (docs/gateway.md).
MANYLINUX_FLOOR = 17
WHEEL_ARCHES = ("x86_64", "aarch64")


class WheelhouseError(ValueError):
    """The node's platform cannot be named for a wheel download."""


def wheel_platforms(arch: str, glibc: str) -> list[str]:
    """The --platform tags for a node of `arch` with `glibc` ("2.36", or `getconf GNU_LIBC_VERSION`'s
    "glibc 2.36"), newest first, then the legacy manylinux2014 alias of 2.17."""
    if arch not in WHEEL_ARCHES:
        raise WheelhouseError(f"architecture {arch!r}: the gateway's wheels exist for {', '.join(WHEEL_ARCHES)}")
    text = str(glibc).split()[-1] if str(glibc).split() else ""
    major, _dot, minor = text.partition(".")
    if major != "2" or not minor.isdigit() or int(minor) < MANYLINUX_FLOOR:
        raise WheelhouseError(f"glibc {glibc!r}: the gateway's wheels need glibc 2.{MANYLINUX_FLOOR} or newer")
    tags = [f"manylinux_2_{m}_{arch}" for m in range(int(minor), MANYLINUX_FLOOR - 1, -1)]
    return [*tags, f"manylinux2014_{arch}"]


def wheelhouse_name(arch: str, python: str) -> str:
    """The wheelhouse's subfolder for one platform: linux-<arch>-cp<major><minor> ("3.12.3" -> cp312)."""
    if arch not in WHEEL_ARCHES:
        raise WheelhouseError(f"architecture {arch!r}: the gateway's wheels exist for {', '.join(WHEEL_ARCHES)}")
    parts = str(python).split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise WheelhouseError(f"Python version {python!r}: expected major.minor[.micro]")
    return f"linux-{arch}-cp{parts[0]}{parts[1]}"


def install_source(platform_folder, litellm_version: str, arch: str, index_url: str) -> str:
    """Where the head's venv is installed from: "wheelhouse" when the control node's folder for the head's
    platform holds the pinned LiteLLM for its architecture (offline, the air-gapped path), else "index" when an
    index is named, else "none" (roles/gateway refuses, changing nothing)."""
    from pathlib import Path  # noqa: PLC0415

    folder = Path(str(platform_folder))
    if any(folder.glob(f"litellm-{litellm_version}-*{arch}.whl")):
        return "wheelhouse"
    return "index" if str(index_url or "") else "none"


def pip_download_argv(pip: list[str], dest: str, requirements: list[str], *, arch: str, python: str, glibc: str):
    """`pip download` of `requirements` for the node, binaries only (no build step on any machine)."""
    parts = str(python).split(".")
    argv = [*pip, "download", "--only-binary=:all:", "--implementation", "cp"]
    argv += ["--python-version", f"{parts[0]}.{parts[1]}"]
    for tag in wheel_platforms(arch, glibc):
        argv += ["--platform", tag]
    return [*argv, "--dest", dest, *requirements]


def marker_environment(arch: str, python: str) -> dict:
    """The node's environment markers (PEP 508) for its arch and its exact Python ("3.11.2")."""
    parts = [*str(python).split("."), "0", "0"][:3]
    full = ".".join(parts)
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": arch,
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "python_version": ".".join(parts[:2]),
        "sys_platform": "linux",
    }


def _wheel_requires(wheel) -> list[str]:
    import zipfile  # noqa: PLC0415 - only the download needs it

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def missing_requirements(dest: str, requirements: list[str], env: dict) -> list[str]:
    """What the node needs that no wheel in `dest` gives. `pip download` judges environment markers with the
    Python that runs it, whatever --python-version says: a controller on CPython 3.11.7 leaves out redis's
    `async-timeout; python_full_version < "3.11.3"`, which Debian 12's 3.11.2 needs, and `pip install
    --no-index` on the node then fails. Walks the requirements from the wheels' own metadata with the node's
    markers (`env`: marker_environment), extras included."""
    from pathlib import Path  # noqa: PLC0415

    from packaging.requirements import Requirement  # noqa: PLC0415 - ansible-core's own dependency
    from packaging.utils import canonicalize_name, parse_wheel_filename  # noqa: PLC0415

    wheels = {}
    for whl in Path(dest).glob("*.whl"):
        name, _version, _build, _tags = parse_wheel_filename(whl.name)
        wheels.setdefault(canonicalize_name(name), whl)
    missing, seen = [], set()
    queue = [Requirement(r) for r in requirements]
    while queue:
        req = queue.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        if name not in wheels:
            missing.append(
                str(
                    Requirement(
                        f"{req.name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}{req.specifier}"
                    )
                )
            )
            continue
        for line in _wheel_requires(wheels[name]):
            dep = Requirement(line)
            extras = sorted(req.extras) or [""]
            if dep.marker is None or any(dep.marker.evaluate({**env, "extra": e}) for e in extras):
                queue.append(dep)
    return sorted(set(missing))


def download_wheelhouse(
    pip: list[str], dest: str, requirements: list[str], *, arch: str, python: str, glibc: str, run=None
):
    """pip download for the node, then the requirements its markers add (missing_requirements), until none is
    missing (bounded: a chain of marker-only dependencies is short). `run(argv)` runs one download (default:
    subprocess.run, checked). Returns the rounds' argv lists."""
    import subprocess  # noqa: PLC0415

    run = run or (lambda argv: subprocess.run(argv, check=True))  # noqa: S603 - argv, no shell
    env = marker_environment(arch, python)
    done, wanted = [], list(requirements)
    for _round in range(6):
        argv = pip_download_argv(pip, dest, wanted, arch=arch, python=python, glibc=glibc)
        run(argv)
        done.append(argv)
        wanted = missing_requirements(dest, requirements, env)
        if not wanted:
            return done
    raise WheelhouseError(f"the wheelhouse {dest} still lacks {', '.join(wanted)} for CPython {python} on {arch}")


if __name__ == "__main__":
    # playbooks/gateway_wheels.yml: python gateway.py DEST ARCH PYTHON GLIBC PIP... -- REQUIREMENTS...
    import sys

    args = sys.argv[1:]
    sep = args.index("--")
    dest_, arch_, python_, glibc_, *pip_ = args[:sep]
    download_wheelhouse(pip_, dest_, args[sep + 1 :], arch=arch_, python=python_, glibc=glibc_)
