"""The `vllm serve` contract of a vLLM release: which options, values and VLLM_* variables it knows.

Controller-only (plugin_utils), stdlib only. A contract is a dict with the keys of the fixtures in
vllm_contracts/vllm-<version>.json (recorded from the official wheel by sim/record_vllm_contract.py,
provenance in vllm_contracts/README.md):

    vllm_version   "0.19.0"
    source         {"wheel", "sha256", "how", ...}
    serve_options  {"--long-option": {"takes_value", "choices", "aliases", ...}, ...}
    value_sets     {"quantization", "kv_cache_dtype", "attention_backend", "moe_backend",
                    "distributed_executor_backend"} -> sorted list, or None where unknown
    env_vars       sorted VLLM_* names the release reads (vllm/envs.py), or None where unknown
    metrics        Prometheus families a default `vllm serve` registers (name, type, labels, help)
    speculative_config  {"fields", "methods", "aux_hidden_states_models"} of --speculative-config's
                   SpeculativeConfig (vllm/config/speculative.py), or absent/None where not recorded

API:
    load_contract(version)               the recorded fixture; ValueError naming the recorded ones
    shared_contract(version)             the same, parsed once per process (for readers that never change it)
    recorded_versions()                  versions with a fixture
    contract_from_help(text, version)    a contract parsed from `vllm serve --help=all` output (the
                                         image's own vLLM, on real hardware)
    check_serve_args(argv, env, contract) -> list of problems, each naming the option (or variable)
                                         and the version; [] when that vLLM accepts them. An option or
                                         variable another recorded release knows is named with that
                                         release (option_history): removed, renamed (same dest) or new.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

CONTRACTS_DIR = Path(__file__).resolve().parent / "vllm_contracts"
VALUE_SET_OPTIONS = {
    "quantization": "--quantization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "attention_backend": "--attention-backend",
    "moe_backend": "--moe-backend",
    "distributed_executor_backend": "--distributed-executor-backend",
}
_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+([.+-][0-9A-Za-z.+-]+)?$")


def recorded_versions() -> list[str]:
    """Versions that have a recorded fixture, oldest first."""
    names = (p.name[len("vllm-") : -len(".json")] for p in CONTRACTS_DIR.glob("vllm-*.json"))
    return sorted(names, key=lambda v: [int(x) if x.isdigit() else x for x in re.split(r"[.+-]", v)])


def load_contract(version) -> dict:
    """The recorded contract of vLLM `version` (e.g. "0.19.0").

    Raises ValueError when no fixture was recorded for it, naming the recorded versions and how to add one.
    """
    version = str(version).strip()
    if not _VERSION_RE.match(version):
        raise ValueError(f"vLLM version must look like 0.19.0, got {version!r}")
    path = CONTRACTS_DIR / f"vllm-{version}.json"
    if not path.is_file():
        raise ValueError(
            f"no recorded vLLM contract for version {version} (recorded: {', '.join(recorded_versions()) or 'none'}); "
            f"record it from the official wheel with `python3 sim/record_vllm_contract.py {version}`"
        )
    contract = json.loads(path.read_text())
    if contract.get("vllm_version") != version:
        raise ValueError(f"{path.name} says vllm_version {contract.get('vllm_version')!r}, expected {version!r}")
    return contract


_SHARED: dict[str, tuple] = {}


def shared_contract(version) -> dict:
    """load_contract(version), parsed once per process and the same object each time: for readers that never
    change it (the plan's checks). The cluster model checks every profile against its stack's contract in every
    play (the recorded files are 120-200 KB of JSON); the preload_plugins callback reads them in the main process
    (warm_contracts), so that every task's worker finds them parsed. A file changed since is read again."""
    version = str(version).strip()
    path = CONTRACTS_DIR / f"vllm-{version}.json"
    try:
        stamp = path.stat().st_mtime_ns if _VERSION_RE.match(version) else None
    except OSError:
        stamp = None
    cached = _SHARED.get(version)
    if cached is None or stamp is None or cached[0] != stamp:
        contract = load_contract(version)  # raises as load_contract does
        if stamp is None:
            return contract
        _SHARED[version] = cached = (stamp, contract)
    return cached[1]


def warm_contracts() -> None:
    """Parse every recorded contract into shared_contract's cache (see there)."""
    for version in recorded_versions():
        shared_contract(version)


def _recorded(version: str) -> dict | None:
    """The recorded contract of `version` (shared_contract's, parsed once per process); None when it cannot be read."""
    try:
        return shared_contract(version)
    except (ValueError, OSError):
        return None


def _version_key(version: str) -> list:
    return [int(x) if x.isdigit() else x for x in re.split(r"[.+-]", str(version))]


def option_history(name: str, contract: dict) -> str:
    """What the OTHER recorded releases say about an option `contract`'s release does not accept: "" when
    none knows it. An older release that took it: "vLLM 0.19.0 took it; 0.33.0 removed it", or "renamed
    it to --new" when the new release has a visible option with the same argparse dest (the same setting
    under another name). A newer release that takes it: "it is new in vLLM 0.33.0"."""
    version = str(contract.get("vllm_version", "?"))
    mine = contract.get("serve_options") or {}
    older, newer = [], []
    for other in recorded_versions():
        if other == version:
            continue
        theirs = _recorded(other)
        if theirs is None:
            continue
        spec = (theirs.get("serve_options") or {}).get(name)
        if spec is None:
            spec = next((s for s in theirs["serve_options"].values() if name in (s.get("aliases") or ())), None)
        if spec is None:
            continue
        (older if _version_key(other) < _version_key(version) else newer).append((other, spec))
    if older:
        other, spec = older[-1]  # the newest release before this one that took it
        dest = spec.get("dest")
        renamed = sorted(
            opt
            for opt, s in mine.items()
            if dest and s.get("dest") == dest and not s.get("hidden") and not opt.startswith("--no-")
        )
        if renamed:
            return f"vLLM {other} took it; {version} renamed it to {' / '.join(renamed)}"
        return f"vLLM {other} took it; {version} removed it"
    if newer:
        return f"it is new in vLLM {newer[0][0]}: {version} does not have it yet"
    return ""


def env_history(name: str, contract: dict) -> str:
    """Which other recorded release reads VLLM_* variable `name` that `contract`'s release does not."""
    version = str(contract.get("vllm_version", "?"))
    readers = []
    for other in recorded_versions():
        theirs = _recorded(other) if other != version else None
        if theirs and name in (theirs.get("env_vars") or ()):
            readers.append(other)
    if not readers:
        return ""
    older = [v for v in readers if _version_key(v) < _version_key(version)]
    if older:
        return f"vLLM {older[-1]} read it; {version} dropped it"
    return f"it is new in vLLM {readers[0]}: {version} does not read it yet"


# --- `vllm serve --help=all` --------------------------------------------------------------------------

# An option line of argparse's help: exactly two spaces (argparse indents a section's arguments by 2;
# vLLM's epilog examples are indented by 3), then the invocation ("--quantization Q, -q Q" on Python
# <= 3.12, "-q, --quantization Q" on 3.13+), then optionally two or more spaces and help text.
_OPTION_LINE = re.compile(r"^  (-{1,2}[A-Za-z0-9][^\s,]*(?:[ ,].*)?)$")
# A metavar that is argparse's rendering of choices: "{a,b}", "[{a,b}]" or "{a,b} [{a,b} ...]" and nothing
# else (vLLM's "--tool-call-parser {...} or name registered in --tool-parser-plugin" is a free string).
_CHOICES_METAVAR = re.compile(r"^\[?\{([^{}]*)\}\]?(?: \[\{[^{}]*\} \.\.\.\])?$")


def _split_invocation(text: str) -> list[str]:
    """'-q {a,b}, --quantization {a,b}  Help...' -> ['-q {a,b}', '--quantization {a,b}'] (help text dropped)."""
    parts, depth, cur = [], 0, ""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if depth == 0 and text.startswith(", ", i) and i + 2 < len(text) and text[i + 2] == "-":
            parts.append(cur)
            cur, i = "", i + 2
            continue
        if depth == 0 and text.startswith("  ", i):
            break  # help text follows on the same line
        cur += ch
        i += 1
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def contract_from_help(text, version, env_vars=None) -> dict:
    """A contract read from `vllm serve --help=all` output of vLLM `version`.

    Options, whether each takes a value, its aliases and its choices (where argparse prints them as
    {a,b,c}) come from the text. The help text does not list VLLM_* variables or metrics: `env_vars`
    (e.g. the output of `python3 -c 'import vllm.envs as e; print(*e.environment_variables)'` in the
    image) is used when given, else the recorded fixture of that version when there is one, else None
    (unknown: check_serve_args then says it could not check them).
    Raises ValueError when the text has no `vllm serve` options in it.
    """
    if not isinstance(text, str):
        raise ValueError(f"help text must be a string, got {type(text).__name__}")
    version = str(version).strip()
    options: dict[str, dict] = {}
    for line in text.splitlines():
        m = _OPTION_LINE.match(line)
        if not m:
            continue
        parts = _split_invocation(m.group(1))
        names, value_of = [], {}
        for part in parts:
            name, _sep, args = part.partition(" ")
            if not re.match(r"^-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*$", name):
                names = []
                break
            names.append(name)
            value_of[name] = args.strip()
        if not names or not any(n.startswith("--") for n in names):
            continue
        # Python 3.13 prints the metavar once, after the last option string.
        args = next((value_of[n] for n in reversed(names) if value_of[n]), "")
        choices = metavar_values = None
        cm = _CHOICES_METAVAR.match(args)
        if cm:
            choices = [c for c in cm.group(1).split(",") if c != ""]
        lm = re.match(r"^\[('[^']*'(?:, '[^']*')*)\]$", args)
        if lm:
            metavar_values = re.findall(r"'([^']*)'", lm.group(1))
        if args.endswith(" ...]"):
            nargs = "*" if args.startswith("[") else "+"
        elif args.startswith("[") and args.endswith("]") and not lm:
            nargs = "?"
        else:
            nargs = None
        for name in names:
            if not name.startswith("--"):
                continue
            options[name] = {
                "takes_value": bool(args),
                "choices": choices,
                "aliases": [n for n in names if n != name],
                "nargs": nargs,
                "metavar_values": metavar_values,
            }
    if "--model" not in options and "--tensor-parallel-size" not in options:
        raise ValueError(
            "this is not `vllm serve --help=all` output: no --tensor-parallel-size option found "
            f"({len(options)} options parsed)"
        )
    recorded = None
    try:
        recorded = load_contract(version)
    except ValueError:
        recorded = None
    if env_vars is not None:
        env_list = sorted({str(v) for v in env_vars if str(v).startswith("VLLM_")})
        env_source = "given"
    elif recorded is not None:
        env_list, env_source = recorded["env_vars"], f"recorded fixture vllm-{version}.json"
    else:
        env_list, env_source = None, "unknown"
    value_sets = {}
    for key, opt in VALUE_SET_OPTIONS.items():
        choices = (options.get(opt) or {}).get("choices")
        if choices:
            value_sets[key] = sorted(c for c in choices if c != "None")
        elif recorded is not None and opt in options:
            value_sets[key] = recorded["value_sets"].get(key)
        else:
            value_sets[key] = None
    return {
        "vllm_version": version,
        "source": {"how": "parsed from `vllm serve --help=all` output", "env_vars": env_source},
        "serve_options": dict(sorted(options.items())),
        "value_sets": value_sets,
        "env_vars": env_list,
        "metrics": recorded["metrics"] if recorded else None,
        # the help text does not show SpeculativeConfig's keys and methods: the release's recording does
        "speculative_config": recorded.get("speculative_config") if recorded else None,
    }


# --- checking an argv and an environment ------------------------------------------------------------


def _alias_map(options: dict) -> dict[str, str]:
    """Every option string (long and short) -> its canonical long option."""
    out = {}
    for name, spec in options.items():
        out[name] = name
        for alias in spec.get("aliases") or []:
            out.setdefault(alias, name)
    return out


def _normalise(arg: str) -> str:
    """FlexibleArgumentParser: underscores become dashes in the name, up to the first '.' (vllm 0.19.0
    vllm/utils/argparse_utils.py, parse_args)."""
    head, dot, tail = arg[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def check_serve_args(argv, env, contract) -> list[str]:
    """Problems `vllm serve` of `contract`'s version would have with `argv` and `env`; [] when none.

    argv: the command line, with or without a leading "vllm", "serve" (the model may be first).
    env: mapping of environment variables (only VLLM_* names are judged). Each problem names the
    option or variable and the vLLM version; an unknown option or a value outside the option's
    choices is what makes that vLLM exit 2 (argparse).
    """
    if not isinstance(contract, dict) or "serve_options" not in contract:
        raise ValueError("contract must be a vLLM contract dict (load_contract or contract_from_help)")
    if isinstance(argv, str) or not isinstance(argv, (list, tuple)):
        raise ValueError(f"argv must be a list of strings, got {type(argv).__name__}")
    version = contract.get("vllm_version", "?")
    options = contract["serve_options"]
    aliases = _alias_map(options)
    problems: list[str] = []
    args = [str(a) for a in argv]
    if args[:1] == ["vllm"]:
        args = args[1:]
    if args[:1] == ["serve"]:
        args = args[1:]
    positionals = 0
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            positionals += len(args) - i
            break
        if not arg.startswith("-") or arg == "-" or re.match(r"^-\d", arg):
            positionals += 1
            continue
        if arg == "-O" and i < len(args) and args[i] in ("0", "1", "2", "3"):
            arg = "--optimization-level"  # FlexibleArgumentParser: -O <n>
        elif arg.startswith("-O") and not arg.startswith("--") and arg != "-O":
            # -O3 / -O=3 / -Odecode: FlexibleArgumentParser turns it into --optimization-level
            if "--optimization-level" not in options:
                problems.append(f"{arg}: vLLM {version} has no --optimization-level (-O)")
            continue
        name, has_eq, value = arg.partition("=")
        if name.startswith("--"):
            name = _normalise(name)
        dotted = None
        if name.startswith("--") and "." in name:
            name, _sep, dotted = name.partition(".")
        canonical = aliases.get(name)
        if canonical is None:
            history = option_history(name, contract)
            near = None if history else _nearest(name, options)
            problems.append(
                f"{name}: unrecognized argument for vLLM {version} `vllm serve` (it would exit 2)"
                + (f"; {history}" if history else "")
                + (f"; did you mean {near}?" if near else "")
            )
            # skip what looks like this unknown option's value
            if not has_eq and i < len(args) and not args[i].startswith("-"):
                i += 1
            continue
        spec = options[canonical]
        if dotted is not None:
            # --compilation-config.mode 3: a key of a JSON option
            if spec.get("type") not in (None, "loads", "parse_type", "_json_or_dict") and not spec.get("takes_value"):
                problems.append(f"{name}.{dotted}: {name} of vLLM {version} takes no JSON keys")
            if not has_eq:
                i += 1
            continue
        if not spec.get("takes_value"):
            if has_eq:
                problems.append(f"{name}: takes no value in vLLM {version}, got {arg!r} (it would exit 2)")
            continue
        values: list[str] = []
        if has_eq:
            values = [value]
        else:
            nargs = spec.get("nargs")
            if nargs in ("+", "*"):
                while i < len(args) and not args[i].startswith("-"):
                    values.append(args[i])
                    i += 1
            elif nargs == "?":
                if i < len(args) and not args[i].startswith("-"):
                    values.append(args[i])
                    i += 1
            elif isinstance(nargs, int) and nargs > 1:
                values, i = args[i : i + nargs], i + nargs
            elif i < len(args) and (not args[i].startswith("-") or re.match(r"^-\d", args[i])):
                values.append(args[i])
                i += 1
            if not values and nargs not in ("?", "*"):
                problems.append(f"{name}: expects a value in vLLM {version}, none given (it would exit 2)")
                continue
        problems += value_problems(canonical, values, contract)
    if positionals > 1:
        problems.append(f"vLLM {version} `vllm serve` takes one model, got {positionals} positional arguments")
    problems += _check_env(env, contract)
    return problems


_SET_OF_OPTION = {opt: key for key, opt in VALUE_SET_OPTIONS.items()}


def value_problems(option: str, values: list[str], contract: dict) -> list[str]:
    """Values of `option` (canonical long name) that vLLM of `contract` refuses, and when it refuses them.

    argparse choices: `vllm serve` exits 2 at once. The value_sets whose option is a free string
    (quantization: ModelConfig._verify_quantization; attention backend: AttentionConfig's validator;
    executor backend: Executor.get_class, which also takes a class qualname) fail later, at engine
    config, with exit 1. metavar_values (a `Literal | str` field's known values) are not enforced: vLLM
    takes other strings there too.
    """
    version = contract.get("vllm_version", "?")
    spec = contract["serve_options"].get(option) or {}
    out = []
    choices = spec.get("choices")
    if choices:
        for v in values:
            if v not in choices:
                out.append(
                    f"{option} {v}: invalid choice for vLLM {version} (it would exit 2); "
                    f"choose from {', '.join(choices)}"
                )
        return out
    key = _SET_OF_OPTION.get(option)
    allowed = (contract.get("value_sets") or {}).get(key) if key else None
    if not allowed:
        return out
    for v in values:
        probe = v
        if key == "attention_backend":
            # AttentionConfig.validate_backend_before: "auto" means automatic, names are upper-cased
            if v.lower() == "auto":
                continue
            probe = v.upper()
        if key == "distributed_executor_backend" and "." in v:
            continue  # a qualname of an Executor subclass (vllm/v1/executor/abstract.py get_class)
        if probe not in allowed:
            out.append(
                f"{option} {v}: not a value vLLM {version} knows (it would fail at engine config, exit 1); "
                f"known: {', '.join(allowed)}"
            )
    return out


def _check_env(env, contract) -> list[str]:
    if env is None:
        return []
    if not isinstance(env, dict):
        raise ValueError(f"env must be a mapping of variable names to values, got {type(env).__name__}")
    version = contract.get("vllm_version", "?")
    known = contract.get("env_vars")
    names = sorted(str(n) for n in env if str(n).startswith("VLLM_"))
    if known is None:
        return [f"{n}: cannot be checked, the VLLM_* variables of vLLM {version} are unknown" for n in names]
    known_set = set(known)
    out = []
    for n in names:
        if n not in known_set:
            history = env_history(n, contract)
            near = None if history else _nearest(n, {k: None for k in known})
            out.append(
                f"{n}: vLLM {version} does not read this environment variable (not in its vllm/envs.py)"
                + (f"; {history}" if history else "")
                + (f"; did you mean {near}?" if near else "")
            )
    return out


def _nearest(name: str, candidates) -> str | None:
    import difflib  # noqa: PLC0415 - only on the error path

    found = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.9)
    return found[0] if found else None


def has_choice(contract: dict, option: str, value: str) -> bool:
    """True when `option` exists in the contract and accepts `value` (any value if it has no choices)."""
    spec = contract["serve_options"].get(option)
    if spec is None or not spec.get("takes_value"):
        return False
    return not spec.get("choices") or value in spec["choices"]


def has_env(contract: dict, name: str) -> bool:
    """True when the contract's vLLM reads environment variable `name`."""
    return name in (contract.get("env_vars") or ())
