# ruff: noqa: E501 - the entries quote source lines and mutations verbatim
"""Equivalent mutants: changes no input can tell apart from the original (tests/mutation/README.md).

`make mutation` samples them like the others (so listing one leaves the sample as it was) but neither runs
nor scores them. Each entry: the module, its source line (stripped) and the mutation as `mutate.py --list`
prints them, and why. The test file of the module says the same next to its tests.
"""

EQUIVALENTS = [
    # plugins/module_utils/capacity.py
    {
        "module": "plugins/module_utils/capacity.py",
        "line": "for r, e2e in zip(good, e2els, strict=True)",
        "mutation": "True -> False",
        "why": "e2els is built from good: the lengths are always equal",
    },
    {
        "module": "plugins/module_utils/capacity.py",
        "line": "for name, values in zip(METRICS, (ttfts, tpots, itls, e2els), strict=True):",
        "mutation": "True -> False",
        "why": "METRICS names four metrics and the tuple holds four lists",
    },
    {
        "module": "plugins/module_utils/capacity.py",
        "line": "return {k: (round(v, 4) if isinstance(v, float) and math.isfinite(v) else v) for k, v in run.items()}",
        "mutation": "clause dropped: `math.isfinite(v)` from `isinstance(v, float) and math.isfinite(v)`",
        "why": "round(nan, 4) is nan and round(inf, 4) is inf",
    },
    {
        "module": "plugins/module_utils/capacity.py",
        "line": 'out_tokens = sum(r.get("completion_tokens") or 0 for r in good)',
        "mutation": "clause dropped: `0` from `r.get('completion_tokens') or 0`",
        "why": "the records are bench.RequestResult.as_dict(): completion_tokens is an int, never None",
    },
    {
        "module": "plugins/module_utils/capacity.py",
        "line": 'dur = duration_s if duration_s and duration_s > 0 else float("nan")',
        "mutation": "clause dropped: `duration_s` from `duration_s and duration_s > 0`",
        "why": "the level's duration is the measured wall clock (a float), never None; 0 gives nan either way",
    },
    {
        "module": "plugins/module_utils/capacity.py",
        "line": 'run["completed"] == 0',
        "mutation": "clause dropped: `run['completed'] == 0` from `run['completed'] == 0 or tok_s * break_factor < target['min_tok_s_p...`",
        "why": "no success means per_user_tok_s 0.0, below any SLO (slo() refuses <= 0): the next clause holds",
    },
    {
        "module": "plugins/module_utils/capacity.py",
        "line": 'peak = max(runs, key=lambda r: r["output_throughput"] or 0, default=None)',
        "mutation": "0 -> -1",
        "why": "every falsy throughput maps to the same constant; real ones are >= 0 or nan (truthy)",
    },
    # plugins/module_utils/firewall.py
    {
        "module": "plugins/module_utils/firewall.py",
        "line": "ok = 0 < len(parts) <= 2 and all(x.isdigit() and 1 <= int(x) <= 65535 for x in parts)  # noqa: PLR2004",
        "mutation": "`0 < len(parts) <= 2` -> `0 <= len(parts) <= 2`",
        "why": "str.split(':') returns at least one part: len(parts) is never 0",
    },
    {
        "module": "plugins/module_utils/firewall.py",
        "line": 'return len(appended) == len(rules) and all(present) and bool(appended) and appended[-1].endswith("-j DROP")',
        "mutation": "clause dropped: `bool(appended)` from `len(appended) == len(rules) and all(present) and bool(appended) and...`",
        "why": "chain_rules always gives lo's RETURN and the DROP: len(appended) == len(rules) >= 2 already",
    },
    {
        "module": "plugins/module_utils/firewall.py",
        "line": "ok = 0 < len(parts) <= 2 and all(x.isdigit() and 1 <= int(x) <= 65535 for x in parts)  # noqa: PLR2004",
        "mutation": "0 -> -1",
        "why": "str.split(':') returns at least one part: -1 < len(parts) and 0 < len(parts) both always hold",
    },
    {
        "module": "plugins/module_utils/firewall.py",
        "line": "elif n.version == fam and str(n) not in dests:",
        "mutation": "clause dropped: `str(n) not in dests` from `n.version == fam and str(n) not in dests`",
        "why": "_networks gives each network once, and str() of two unequal ipaddress networks differs: a dest is never seen twice",
    },
    # plugins/module_utils/gateway_reload.py
    {
        "module": "plugins/module_utils/gateway_reload.py",
        "line": 'fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces and ")"',
        "mutation": "2 -> 1",
        "why": "the slice then starts at the space after ')', which split() drops",
    },
    {
        "module": "plugins/module_utils/gateway_reload.py",
        "function": "__init__",
        "line": "self.ttin_sent = 0",
        "mutation": "0 -> -1",
        "why": "run() sets ttin_sent to 0 before anything reads it",
    },
    {
        "module": "plugins/module_utils/gateway_reload.py",
        "function": "__init__",
        "line": "self.ttin_sent = 0",
        "mutation": "0 -> 1",
        "why": "run() sets ttin_sent to 0 before anything reads it",
    },
    {
        "module": "plugins/module_utils/gateway_reload.py",
        "function": "proc_stat",
        "line": "except (FileNotFoundError, ProcessLookupError, NotADirectoryError):",
        "mutation": "element dropped: `NotADirectoryError` from `(FileNotFoundError, ProcessLookupError, NotADirectoryError)`",
        "why": "on Linux's /proc a pid's entry is always a folder: a pid that is gone gives ENOENT (or ESRCH while it is reaped), never ENOTDIR",
    },
    {
        "module": "plugins/module_utils/gateway_reload.py",
        "function": "proc_argv",
        "line": "except (FileNotFoundError, ProcessLookupError, NotADirectoryError):",
        "mutation": "element dropped: `NotADirectoryError` from `(FileNotFoundError, ProcessLookupError, NotADirectoryError)`",
        "why": "on Linux's /proc a pid's entry is always a folder: a pid that is gone gives ENOENT (or ESRCH while it is reaped), never ENOTDIR",
    },
    {
        "module": "plugins/module_utils/gateway_reload.py",
        "line": "return sorted(out, key=lambda w: (w[1], w[0]))",
        "mutation": "0 -> -1",
        "why": "/proc lists pids in ascending order (fs/proc/base.c proc_pid_readdir walks the tgids upward) and sorted() is stable: workers started in the same tick still come out by pid",
    },
    {
        "module": "plugins/module_utils/gateway_reload.py",
        "line": 'result["new_pid"] = live[-1][0]',
        "mutation": "1 -> 0",
        "why": "live[-0] is live[0], the same worker: this branch runs only when len(live) == 1",
    },
    # plugins/plugin_utils/day2_checks.py
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'got = {h: r for h, r in (reads or {}).items() if isinstance(r, dict) and r.get("ports") is not None}',
        "mutation": "clause dropped: `{}` from `reads or {}`",
        "why": "build_verdicts, the one caller, always passes a dict of the nodes' reads",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'alive, gpus = int(ray.get("nodes_alive", 0)), float(ray.get("gpus_total", 0) or 0)',
        "mutation": "clause dropped: `0` from `ray.get('gpus_total', 0) or 0`",
        "why": "ray_cluster_status always gives gpus_total as a number (0.0 without GPUs), never None",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'out.append(check_allowed_rules(inputs.get("allowed_rules") or []))',
        "mutation": "clause dropped: `[]` from `inputs.get('allowed_rules') or []`",
        "why": "check_allowed_rules takes None as it takes []: every rule enforced, PASS",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'why = r.get("msg") or r.get("failure_kind") or "not asked"',
        "mutation": "clause dropped: `r.get('failure_kind')` from `r.get('msg') or r.get('failure_kind') or 'not asked'`",
        "why": "a result judged N/A with a failure_kind is a failed one, and every failed vllm_quality result carries msg (plugins/modules/vllm_quality.py:170,178,228; Ansible's unreachable ones too); the one failure_kind without msg, wrong_answers (exit_json at :190), comes with its verdict and is judged",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'why = state.get("gave_up_reason") or state.get("reason") or "unknown"',
        "mutation": "clause dropped: `'unknown'` from `state.get('gave_up_reason') or state.get('reason') or 'unknown'`",
        "why": "the watchdog saves its status with the verdict's reason, a non-empty text, every time (roles/watchdog/files/sparkops_watchdog.py:747-749), and gave_up_reason when it gives up (:761)",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'heard = any(p.get("neighbours") for r in got.values() for p in r.get("ports") or [])',
        "mutation": "clause dropped: `[]` from `r.get('ports') or []`",
        "why": "got keeps only reads whose ports is not None, and fabric_discover's ports is a list (plugins/modules/fabric_discover.py:303): an empty one iterates as [] does",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": "return [check_ray(ray or {}, expected_nodes, expected_gpus)]",
        "mutation": "clause dropped: `{}` from `ray or {}`",
        "why": "check_ray treats every falsy reading as {}: `not ray` gives the failed-read verdict, `(ray or {})` its message",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'keyless = keyless_answers(probe.get("unauth_probes") or {})',
        "mutation": "clause dropped: `{}` from `probe.get('unauth_probes') or {}`",
        "why": "keyless_answers reads `probes or {}`: None and {} give no keyless answer alike",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'restarts = [e for e in events if e.get("event") == "restart_begun" and now_epoch - float(e.get("epoch", 0)) < 3600]',
        "mutation": "0 -> 1",
        "why": "the watchdog writes every event with its epoch (roles/watchdog/files/sparkops_watchdog.py:92) and now_epoch is the controller's clock (doctor.yml, now().timestamp()): an event at epoch 0 or 1 is decades old either way",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'restarts = [e for e in events if e.get("event") == "restart_begun" and now_epoch - float(e.get("epoch", 0)) < 3600]',
        "mutation": "0 -> -1",
        "why": "the watchdog writes every event with its epoch (roles/watchdog/files/sparkops_watchdog.py:92) and now_epoch is the controller's clock (doctor.yml, now().timestamp()): an event at epoch 0 or -1 is decades old either way",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'open_in = [f for f in families.get(sock["address"], ("ipv4", "ipv6")) if not _port_in(port, guarded[f])]',
        "mutation": "element dropped: `'ipv4'` from `('ipv4', 'ipv6')`",
        "why": "the fallback is never taken: a socket is wildcard only for ss's *, 0.0.0.0 and [::] (module_utils/firewall.py:281,310), all three keys of families",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'open_in = [f for f in families.get(sock["address"], ("ipv4", "ipv6")) if not _port_in(port, guarded[f])]',
        "mutation": "element dropped: `'ipv6'` from `('ipv4', 'ipv6')`",
        "why": "the fallback is never taken: a socket is wildcard only for ss's *, 0.0.0.0 and [::] (module_utils/firewall.py:281,310), all three keys of families",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'out.append(check_gpu_clocks(node, f.get("gpu_clocks"), (f.get("gpu") or {}).get("reason") or ""))',
        "mutation": "clause dropped: `''` from `(f.get('gpu') or {}).get('reason') or ''`",
        "why": "check_gpu_clocks says `reason or 'no GPU'`: None and '' read the same",
    },
    {
        "module": "plugins/plugin_utils/day2_checks.py",
        "line": 'reads = {n: (f or {}).get("discover") for n, f in inputs["nodes"].items()}',
        "mutation": "clause dropped: `{}` from `f or {}`",
        "why": "doctor.yml gives every node a dict (doctor_node_inputs is a combine; default={} for a node not reached), and {}.get works",
    },
    # plugins/plugin_utils/discovery.py
    {
        "module": "plugins/plugin_utils/discovery.py",
        "line": 'for name in (h, node.get("hostname")):',
        "mutation": "element dropped: `h` from `(h, node.get('hostname'))`",
        "why": "fabric_discover always reports the hostname (what lldpd advertises); the inventory name adds a match only for a read without one",
    },
    {
        "module": "plugins/plugin_utils/discovery.py",
        "line": 'twins.sort(key=lambda t: (t.get("domain") or 0, t["netdev"]))',
        "mutation": "0 -> 1",
        "why": "a Spark port's twins sit on PCI domains 0 and 2 (enp1s0..., enP2p1s0...): 0 or 1 sorts before 2 alike",
    },
    {
        "module": "plugins/plugin_utils/discovery.py",
        "line": "first = port1_last([c for c in cables if c[0][0] in comps[0]][0])",
        "mutation": "0 -> 1",
        "nth": 4,
        "why": "c[1][0] for c[0][0]: both ends of a cable of a loop are hosts of that loop, so the same cables are picked",
    },
    {
        "module": "plugins/plugin_utils/discovery.py",
        "line": 'for nb in t.get("neighbours") or []:',
        "mutation": "clause dropped: `[]` from `t.get('neighbours') or []`",
        "why": "fabric_discovery always gives neighbours as a list",
    },
    {
        "module": "plugins/plugin_utils/discovery.py",
        "line": '_NEIGHBOUR_TEXT = ("chassis_id", "chassis_id_type", "sysname", "port_id", "port_id_type", "port_descr")',
        "mutation": "element dropped: `'port_descr'` from `('chassis_id', 'chassis_id_type', 'sysname', 'port_id', 'port_id_ty...`",
        "why": "port_descr is only looked up among the Sparks' netdev names (resolve), never shown: a ConnectX-7 function's name (enp1s0f0np0: letters and digits, at most 15) equals the string as sent exactly when it equals it escaped and cut at 255",
    },
    {
        "module": "plugins/plugin_utils/discovery.py",
        "line": "if t < len(tw):",
        "mutation": "`t < len(tw)` -> `t <= len(tw)`",
        "why": "on a switch every port has its two twins here (a port with one is refused above by _twin_states): t never reaches len(tw)",
    },
    {
        "module": "plugins/plugin_utils/discovery.py",
        "line": '{k: t.get(k) for k in ("netdev", "rdma_device", "port", "pci", "mac", "operstate", "speed_mbps", "mtu")}',
        "mutation": "element dropped: `'mac'` from `('netdev', 'rdma_device', 'port', 'pci', 'mac', 'operstate', 'speed...`",
        "why": "nothing reads a port's MAC from the result: summary, moved_cables and the refusal's node lines (filter/discovery.py) read netdev, port, rdma_device, operstate, speed_mbps and mtu only",
    },
    # plugins/plugin_utils/vllm_contract.py
    {
        "module": "plugins/plugin_utils/vllm_contract.py",
        "line": "elif isinstance(nargs, int) and nargs > 1:",
        "mutation": "`nargs > 1` -> `nargs < 1`",
        "why": "no contract has an integer nargs: the recorded ones keep None, '?' or '+', and help text gives none",
    },
    {
        "module": "plugins/plugin_utils/vllm_contract.py",
        "line": 'if not names or not any(n.startswith("--") for n in names):',
        "mutation": "clause dropped: `not any((n.startswith('--') for n in names))` from `not names or not any((n.startswith('--') for n in names))`",
        "why": "only the names starting with -- become options below: a line of short options alone adds none either way",
    },
    {
        "module": "plugins/plugin_utils/vllm_contract.py",
        "line": "if isinstance(argv, str) or not isinstance(argv, (list, tuple)):",
        "mutation": "clause dropped: `isinstance(argv, str)` from `isinstance(argv, str) or not isinstance(argv, (list, tuple))`",
        "why": "a str is not a list or tuple: the second clause refuses it as well",
    },
    {
        "module": "plugins/plugin_utils/vllm_contract.py",
        "line": 'if depth == 0 and text.startswith(", ", i) and i + 2 < len(text) and text[i + 2] == "-":',
        "mutation": "clause dropped: `text[i + 2] == '-'` from `depth == 0 and text.startswith(', ', i) and (i + 2 < len(text)) and...`",
        "why": "argparse joins option strings with ', ' and each starts with '-'; its help text starts after two spaces, where the split stops first",
    },
    {
        "module": "plugins/plugin_utils/vllm_contract.py",
        "line": "continue  # a qualname of an Executor subclass (vllm/v1/executor/abstract.py get_class)",
        "mutation": "continue -> break",
        "why": "--distributed-executor-backend takes one value: check_serve_args, the one caller, passes a list of one",
    },
    {
        "module": "plugins/plugin_utils/vllm_contract.py",
        "line": 'if depth == 0 and text.startswith(", ", i) and i + 2 < len(text) and text[i + 2] == "-":',
        "mutation": "2 -> 3",
        "nth": 1,
        "why": "i + 3 < len(text) for i + 2: an option string after ', ' is two characters at least ('-q'), so both hold",
    },
    {
        "module": "plugins/plugin_utils/vllm_contract.py",
        "line": "elif isinstance(nargs, int) and nargs > 1:",
        "mutation": "1 -> 0",
        "why": "no contract has an integer nargs: the recorded ones keep None, '?' or '+', and help text gives none",
    },
    {
        "module": "plugins/plugin_utils/vllm_contract.py",
        "line": "return found[0] if found else None",
        "mutation": "0 -> -1",
        "why": "get_close_matches(n=1) returns one match at most: found[-1] is found[0]",
    },
    # plugins/plugin_utils/gateway.py
    {
        "module": "plugins/plugin_utils/gateway.py",
        "line": 'parts = [*str(python).split("."), "0", "0"][:3]',
        "mutation": "element dropped: `'0'` from `[*str(python).split('.'), '0', '0']`",
        "why": "the node's Python is major.minor at least (wheelhouse_name refuses less): one '0' fills the micro alike",
    },
    # plugins/plugin_utils/serving.py
    {
        "module": "plugins/plugin_utils/serving.py",
        "line": 'first = served[0] if served else ({"profile_name": name}, None, None, 0)',
        "mutation": "0 -> 1",
        "nth": 2,
        "why": "build_serving reads only first[0] (the spec) and first[2] (the profile), never first[3], the node count",
    },
    {
        "module": "plugins/plugin_utils/serving.py",
        "line": 'first = served[0] if served else ({"profile_name": name}, None, None, 0)',
        "mutation": "0 -> -1",
        "nth": 2,
        "why": "build_serving reads only first[0] (the spec) and first[2] (the profile), never first[3], the node count",
    },
    {
        "module": "plugins/plugin_utils/serving.py",
        "line": 'first = served[0] if served else ({"profile_name": name}, None, None, 0)',
        "mutation": "element dropped: `0` from `({'profile_name': name}, None, None, 0)`",
        "why": "build_serving reads only first[0] (the spec) and first[2] (the profile), never first[3], the node count",
    },
    {
        "module": "plugins/plugin_utils/serving.py",
        "line": 'if rep["executor"] != "ray" or not members:',
        "mutation": "`rep['executor'] != 'ray' or not members`: or -> and",
        "why": "the one caller is build_serving, on its own plan; there a replica's members carry `ray` exactly when its executor is ray (_replica_members sets it on every member of a 'ray' group and on no other; a group is never empty): both clauses are true or both false",
    },
    {
        "module": "plugins/plugin_utils/serving.py",
        "line": 'if rep["executor"] != "ray" or not members:',
        "mutation": "clause dropped: `rep['executor'] != 'ray'` from `rep['executor'] != 'ray' or not members`",
        "why": "the one caller is build_serving, on its own plan; there a replica's members carry `ray` exactly when its executor is ray (_replica_members sets it on every member of a 'ray' group and on no other; a group is never empty): both clauses are true or both false",
    },
    {
        "module": "plugins/plugin_utils/serving.py",
        "line": 'if rep["executor"] != "ray" or not members:',
        "mutation": "clause dropped: `not members` from `rep['executor'] != 'ray' or not members`",
        "why": "the one caller is build_serving, on its own plan; there a replica's members carry `ray` exactly when its executor is ray (_replica_members sets it on every member of a 'ray' group and on no other; a group is never empty): both clauses are true or both false",
    },
]
