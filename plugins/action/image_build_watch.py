"""Action plugin: where the image build is, read from its log on the build node, at each poll.

An `until` loop on this task is the build's poll: every retry reads the end of the build log
(sparkops.cluster.image_build writes it) and the exit status file, and says the phase (FlashInfer,
vLLM, runner image), the BuildKit step and the time since the start. The result is marked to be
shown at every retry (as debug's is), so a user sees the stage without -v. When the build has
ended it fails with the log's last lines and path if the exit status is not 0. The documentation
lives in plugins/modules/image_build_watch.py.
"""

from __future__ import annotations

import shlex
import time

from ansible.plugins.action import ActionBase
from ansible_collections.sparkops.cluster.plugins.module_utils.build_log import (
    WATCH_ARGUMENT_SPEC,
    WATCH_RECHECK_S,
    build_stage,
    elapsed_text,
    failure_message,
    parse_watch_output,
    progress_message,
    watch_command,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(WATCH_ARGUMENT_SPEC)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        # Bad input fails here, naming the option (AnsibleActionFail), before the node is asked anything.
        args = self.validate_argument_spec(argument_spec=WATCH_ARGUMENT_SPEC)[1]
        log_path = args["log_path"]
        started = args["started"] if args["started"] is not None else time.time()
        timeout_s = args["timeout_s"]
        tail = args["tail_lines"]
        if self._play_context.check_mode:
            return {**result, "skipped": True, "msg": "check mode: no build runs, so there is nothing to watch"}
        cmd = " ".join(shlex.quote(a) for a in watch_command(str(log_path)))
        # One poll of the until loop: the log read now, then again every WATCH_RECHECK_S while the build runs,
        # for at most wait_s; it returns as soon as the build has ended.
        until = time.monotonic() + args["wait_s"]
        while True:
            res = self._low_level_execute_command(cmd, sudoable=True)
            if res.get("rc", 1) != 0:
                return {
                    **result,
                    "failed": True,
                    "msg": f"could not read the build log {log_path} on the build node: {res.get('stderr', '')[-300:]}",
                }
            text, rc = parse_watch_output(res.get("stdout", ""), args["run_id"])
            if rc is not None or time.monotonic() + WATCH_RECHECK_S > until:
                break
            time.sleep(WATCH_RECHECK_S)
        elapsed = time.time() - started
        stage = build_stage(text)
        result.update(
            changed=False,
            finished=rc is not None,
            rc=rc,
            phase=stage["phase"],
            step=stage["step"],
            elapsed_s=round(elapsed, 1),
            log_path=log_path,
            # shown at every retry of the until loop, as debug's result is (callback _run_is_verbose)
            _ansible_verbose_always=True,
        )
        if rc is None:
            result["msg"] = progress_message(text, elapsed, log_path)
            if elapsed > timeout_s + 300:
                result.update(
                    failed=True,
                    finished=True,
                    msg=f"the build left no exit status after {elapsed_text(elapsed)} (limit {timeout_s} s): it was "
                    f"killed or the node restarted. " + failure_message(text, -1, elapsed, log_path, tail),
                )
        elif rc != 0:
            result.update(failed=True, msg=failure_message(text, rc, elapsed, log_path, tail))
        else:
            result["msg"] = f"built in {elapsed_text(elapsed)}; log {log_path}"
        return result
