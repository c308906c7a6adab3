"""Day-2 filters: the memory plan (preflight) and the doctor's verdicts.

    {{ profile | sparkops.cluster.memory_plan_problems(node_memory_gib=128, overhead_gib=6, floor_gib=4) }} -> messages
    {{ inputs | sparkops.cluster.doctor_verdicts }}                         -> list of verdicts
    {{ verdicts | sparkops.cluster.doctor_overall }}                        -> PASS | WARN | CRITICAL
    {{ verdicts | sparkops.cluster.doctor_markdown(cluster, generated) }}   -> Markdown report
    {{ sparkops_cluster | sparkops.cluster.doctor_keyless_urls }}           -> URLs probed without the key
    {{ watchdog_state | sparkops.cluster.watchdog_status_line }}            -> the status playbook's watchdog line

The logic lives in plugins/plugin_utils/day2_checks.py (controller only, unit-tested).
"""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError
from ansible_collections.sparkops.cluster.plugins.plugin_utils import day2_checks


def _plain(value):
    # Ansible's own str/dict/list subclasses -> plain JSON types for the pure code.
    return json.loads(json.dumps(value, default=str))


def memory_plan_problems(profile, node_memory_gib, overhead_gib, floor_gib):
    try:
        return day2_checks.memory_plan_problems(
            _plain(profile), float(node_memory_gib), float(overhead_gib), float(floor_gib)
        )
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"memory_plan_problems: {exc}") from exc


def doctor_verdicts(inputs):
    try:
        return day2_checks.build_verdicts(_plain(inputs))
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"doctor_verdicts: missing or bad input {exc!r}") from exc


def doctor_overall(verdicts):
    return day2_checks.overall(_plain(verdicts))


def doctor_markdown(verdicts, cluster, generated):
    return day2_checks.render_markdown(str(cluster), _plain(verdicts), str(generated))


def doctor_line(v):
    """One verdict on one line, for the console."""
    v = _plain(v)
    line = f"{v['verdict']:8} {v['check']} [{v['scope']}]: {v['evidence']}"
    return line + (f" -> {v['action']}" if v.get("action") else "")


def doctor_keyless_urls(cluster):
    """The URLs doctor asks without the key: every replica's API node's (day2_checks.keyless_probe_urls)."""
    try:
        return day2_checks.keyless_probe_urls(_plain(cluster))
    except (KeyError, TypeError) as exc:
        raise AnsibleFilterError(f"doctor_keyless_urls: not a cluster model with its serving plan: {exc!r}") from exc


def watchdog_status_line(state):
    """The watchdog's state in one line for the status playbook (day2_checks.watchdog_stopped says why it stopped)."""
    if not isinstance(state, dict) or not state:
        return "no watchdog state on the head (not installed, or never started)"
    state = _plain(state)
    stopped = day2_checks.watchdog_stopped(state)
    if stopped:
        return "STOPPED RESTARTING - " + stopped[len("the watchdog stopped restarting: ") :]
    line = f"{state.get('status', '?')}: {state.get('reason', '')}".rstrip(": ")
    return line + (f" (last probe {state['last_probe_at']})" if state.get("last_probe_at") else "")


class FilterModule:
    def filters(self):
        return {
            "memory_plan_problems": memory_plan_problems,
            "doctor_verdicts": doctor_verdicts,
            "doctor_overall": doctor_overall,
            "doctor_markdown": doctor_markdown,
            "doctor_line": doctor_line,
            "doctor_keyless_urls": doctor_keyless_urls,
            "watchdog_status_line": watchdog_status_line,
        }
