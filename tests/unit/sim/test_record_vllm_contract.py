"""sim/record_vllm_contract.py records what `vllm serve`'s parser ACCEPTS (its option-string table), not what
its help prints: vLLM 0.33.0 keeps --no-enable-x / --no-disable-x registered but hidden from help."""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest
from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (
    CONTRACTS_DIR,
    contract_from_help,
    recorded_versions,
)
from conftest import ROOT

pytestmark = pytest.mark.skipif(not (ROOT / "sim").is_dir(), reason="checkout only: sim/ does not ship")


def _recorder():
    spec = importlib.util.spec_from_file_location("record_vllm_contract", ROOT / "sim" / "record_vllm_contract.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EnableDisableAction(argparse.BooleanOptionalAction):
    """vLLM 0.33.0's action, as vllm/utils/argparse_utils.py:120-145 of the official wheel defines it: `--enable-x`
    pairs with `--disable-x`, and BooleanOptionalAction's `--no-enable-x` stays among the accepted strings."""

    _inverse_prefixes = {"--enable-": "--disable-", "--disable-": "--enable-"}

    def __init__(self, option_strings, dest, *args, **kwargs):
        super().__init__(option_strings, dest, *args, **kwargs)
        inverses = [
            inverse + opt.removeprefix(prefix)
            for opt in option_strings
            for prefix, inverse in self._inverse_prefixes.items()
            if opt.startswith(prefix)
        ]
        negated = {opt for opt in self.option_strings if opt not in option_strings}
        self.negative_option_strings = negated | set(inverses)
        self.visible_option_strings = [*option_strings, *inverses] if inverses else list(self.option_strings)
        self.option_strings = [*self.option_strings, *inverses]

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string not in self.negative_option_strings)


class Parser(argparse.ArgumentParser):
    """FlexibleArgumentParser's registration (argparse_utils.py:148-152, :190-215): BooleanOptionalAction is
    EnableDisableAction, and after argparse registered every string `_register_action` trims the visible ones."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", argparse.BooleanOptionalAction, EnableDisableAction)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if isinstance(action, EnableDisableAction):
            # "Hidden option strings stay registered with the parser but leave help."
            action.option_strings = action.visible_option_strings
        return action


def _serve_like() -> Parser:
    parser = Parser(prog="vllm serve")
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--disable-log-stats", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--trust-remote-code", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--max-model-len", "-l", type=int)
    return parser


def test_the_hidden_no_forms_are_recorded_as_accepted():
    parser = _serve_like()
    options, positionals = _recorder().serve_options(parser)
    assert positionals == [{"dest": "model_tag", "nargs": "?"}]
    for flag, hidden in (
        ("--enable-prefix-caching", False),
        ("--disable-prefix-caching", False),
        ("--no-enable-prefix-caching", True),
        ("--disable-log-stats", False),
        ("--enable-log-stats", False),
        ("--no-disable-log-stats", True),
        ("--trust-remote-code", False),
        ("--no-trust-remote-code", False),
    ):
        assert options[flag]["hidden"] is hidden, flag
        assert options[flag]["takes_value"] is False, flag
    assert sorted(options["--no-enable-prefix-caching"]["aliases"]) == [
        "--disable-prefix-caching",
        "--enable-prefix-caching",
    ]
    assert options["--max-model-len"]["aliases"] == ["-l"]
    # what the recording claims is what the parser does: the hidden form parses, and sets the flag off
    assert parser.parse_args(["--no-enable-prefix-caching"]).enable_prefix_caching is False
    assert parser.parse_args(["--disable-prefix-caching"]).enable_prefix_caching is False
    # ...while help, which the old recording read, does not print it
    assert "--no-enable-prefix-caching" not in parser.format_help()


def test_the_inner_script_runs_the_same_function():
    recorder = _recorder()
    script = recorder.inner_script()
    assert "__SERVE_OPTIONS_SOURCE__" not in script
    assert "def serve_options(serve)" in script and "serve._option_string_actions.items()" in script
    compile(script, "inner", "exec")


@pytest.mark.parametrize("version", recorded_versions())
def test_every_recorded_contract_accepts_what_its_help_prints_and_marks_the_rest_hidden(version):
    contract = json.loads((CONTRACTS_DIR / f"vllm-{version}.json").read_text())
    printed = contract_from_help((CONTRACTS_DIR / f"vllm-{version}.help.txt").read_text(), version)["serve_options"]
    options = contract["serve_options"]
    assert set(printed) <= set(options), sorted(set(printed) - set(options))
    for name, spec in options.items():
        assert spec["hidden"] is (name not in printed), name


def test_0_33_0_hides_exactly_the_no_forms_of_its_enable_disable_pairs():
    options = json.loads((CONTRACTS_DIR / "vllm-0.33.0.json").read_text())["serve_options"]
    hidden = sorted(n for n, s in options.items() if s["hidden"])
    assert "--no-enable-prefix-caching" in hidden and "--no-disable-custom-all-reduce" in hidden
    assert len(hidden) == 50
    assert all(n.startswith(("--no-enable-", "--no-disable-")) for n in hidden), hidden
    for name in hidden:
        pair = "--" + name.removeprefix("--no-")
        assert pair in options and not options[pair]["hidden"], name
        # the same action: the visible pair lists the hidden form among its aliases
        assert name in options[pair]["aliases"], name
