"""Action plugin: one round of sparkops.cluster.vllm_serve_wait, its result shown at every retry.

The module does the waiting on the API host (plugins/modules/vllm_serve_wait.py documents it). A module
cannot print while it runs, so the wait is rounds of an `until` loop; ansible-core's default callback
shows a retry's result only with -vvv, unless the result is marked verbose-always (as debug's is,
callback _run_is_verbose), which a module's own result may not carry (ansible-core strips internal
keys from it). This plugin runs the module and marks a round that ended without an answer, so each
round's progress line (phase, elapsed time, container state, last log line) shows without -v;
the rest of the log tail is left out of a progress round's result (a failure quotes 15 lines).
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(
            self._execute_module(
                module_name="sparkops.cluster.vllm_serve_wait", module_args=self._task.args, task_vars=task_vars
            )
        )
        if not result.get("done", True):
            # Printed every round: the progress line and what it is made of, not the log tail (the line
            # quotes its last line) nor the flags that a round without an answer always has.
            result = {k: v for k, v in result.items() if k not in ("ready", "healthy", "probes")}
            if isinstance(result.get("container"), dict):
                result["container"] = {k: v for k, v in result["container"].items() if k != "log_tail"}
            result["_ansible_verbose_always"] = True
        return result
