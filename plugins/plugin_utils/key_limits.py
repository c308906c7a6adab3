"""The gateway keys' admission limits (docs/gateway.md, "Limits per key"): a key's class and overrides, and the
deployment's measured capacity, in; the limits stored with the key out. Controller side; pure except
latest_sweep(), which reads the capacity sweep's records (playbooks/benchmark.yml writes them on the control node).

The defaults, from `users_at_slo` (plugins/module_utils/capacity.py: the highest concurrency of the last sweep
whose every user got the SLO):
- an `interactive` key may have `users_at_slo` requests in flight: the interactive keys share the seats the
  deployment holds at the SLO (each may use all of them while the others are idle);
- a `batch` key gets what is left once one interactive user is in: `users_at_slo - 1`, at least 1;
- no tokens-per-minute limit.
A sweep where not even one user met the SLO counts as one seat: 1 request at a time for either class.
With no sweep recorded there is nothing measured to share: interactive keys get no limit (as before limits
existed) and batch keys BATCH_FALLBACK (1), the least that is left, until playbooks/benchmark.yml has measured
the deployment. An override (max_parallel_requests, tpm_limit) wins over the default.

LiteLLM counts a key's limit over all its requests, whatever model they ask for.
"""

from __future__ import annotations

import json
import os
import re

KEY_CLASSES = ("interactive", "batch")
BATCH_FALLBACK = 1  # a batch key's requests in flight while no sweep is recorded
# benchmark_report's file names: <cluster_name>-<timestamp>.json (plugins/modules/benchmark_report.py TIMESTAMP_RE)
TIMESTAMP_RE = r"\d{8}T\d{6}Z"
OVERRIDES = ("max_parallel_requests", "tpm_limit")


class KeyLimitsError(ValueError):
    """A key's class or limit override is not usable; the message names the key and the fix."""


def _whole(name: str, field: str, value):
    """An override as an int >= 1, None when unset (None or ''). `-e name=4` gives the string '4': accepted."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise KeyLimitsError(
            f"key {name}: {field} must be a whole number >= 1, got {value!r}; give e.g. "
            f"-e sparkops_key_{field}=2, or leave it out for the default from the capacity sweep"
        )
    return value


def check_class(name: str, key_class) -> str:
    key_class = "interactive" if key_class is None or key_class == "" else key_class
    if key_class not in KEY_CLASSES:
        raise KeyLimitsError(
            f"key {name}: class {key_class!r} is not one of {', '.join(KEY_CLASSES)}; "
            "give -e sparkops_key_class=interactive (the default) or batch"
        )
    return key_class


def seats(users_at_slo) -> int | None:
    """The seats the defaults share: users_at_slo of the sweep, at least 1; None when no sweep is recorded."""
    if isinstance(users_at_slo, int) and not isinstance(users_at_slo, bool) and users_at_slo >= 0:
        return max(1, users_at_slo)
    return None


def default_parallel(key_class: str, users_at_slo) -> int | None:
    """A class's requests in flight (None: no limit) for the sweep's users_at_slo (None: no sweep)."""
    count = seats(users_at_slo)
    if count is None:
        return None if key_class == "interactive" else BATCH_FALLBACK
    return count if key_class == "interactive" else max(1, count - 1)


def key_limits(name: str, key_class=None, max_parallel_requests=None, tpm_limit=None, users_at_slo=None) -> dict:
    """The class and limits stored with key `name` ({key_class, max_parallel_requests, tpm_limit}: what
    plugins/module_utils/gateway_keys.py set_limits takes) and `basis`, one line saying where they come from."""
    key_class = check_class(name, key_class)
    parallel = _whole(name, "max_parallel_requests", max_parallel_requests)
    tpm = _whole(name, "tpm_limit", tpm_limit)
    default = default_parallel(key_class, users_at_slo)
    if seats(users_at_slo) is not None:
        where = f"{users_at_slo} users at the SLO in the last capacity sweep"
    else:
        where = "no capacity sweep recorded: run playbooks/benchmark.yml, then keys.yml again for this key"
    rule = "the interactive keys' share" if key_class == "interactive" else "what is left after one interactive user"
    if parallel is not None:
        basis = f"{parallel} parallel (override)"
    elif default is None:
        basis = f"no parallel limit ({where})"
    else:
        basis = f"{default} parallel, {rule} ({where})"
    basis += f", {tpm} tokens/min (override)" if tpm is not None else ", no tokens/min limit"
    return {
        "limits": {
            "key_class": key_class,
            "max_parallel_requests": parallel if parallel is not None else default,
            "tpm_limit": tpm,
        },
        "basis": f"{name}: {key_class}, {basis}",
    }


def sweep_users_at_slo(record) -> int | None:
    """`capacity.users_at_slo` of a benchmark record (benchmark_report's JSON), or None when it has none (a
    fixed-levels run, a record from before the sweep)."""
    capacity = record.get("capacity") if isinstance(record, dict) else None
    users = capacity.get("users_at_slo") if isinstance(capacity, dict) else None
    return users if isinstance(users, int) and not isinstance(users, bool) and users >= 0 else None


def latest_sweep(folder: str, cluster_name: str, source: str) -> dict:
    """The newest record `<cluster_name>-<timestamp>.json` in `folder` with `source` (hardware or test-double)
    that has a capacity: {path, users_at_slo}, or {path: None, users_at_slo: None}. An unreadable record is
    skipped, never trusted."""
    pattern = re.compile(rf"^{re.escape(cluster_name)}-({TIMESTAMP_RE})\.json$")
    try:
        names = sorted((n for n in os.listdir(folder) if pattern.match(n)), reverse=True)
    except OSError:
        names = []
    for entry in names:
        path = os.path.join(folder, entry)
        try:
            with open(path, encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("source", "hardware") != source:
            continue
        users = sweep_users_at_slo(record)
        if users is not None:
            return {"path": path, "users_at_slo": users}
    return {"path": None, "users_at_slo": None}
