"""vllm_contract.py on the help lines argparse writes (plugins/plugin_utils/vllm_contract.py): an option whose
short alias comes after it, on Python <= 3.12 ("--quantization {a,b}, -q {a,b}"), and one whose help text
follows on the same line after two spaces.

Equivalent mutants (tests/mutation/equivalents.py lists them; `make mutation` does not run them):
- contract_from_help's `if not names or not any(n.startswith("--") for n in names)` without its second
  clause: only the names that start with -- become options further down, so a line of short options alone
  adds none either way.
- _split_invocation's split at ", " without `text[i + 2] == "-"`: argparse joins option strings with ", " and
  each starts with "-"; a ", " not followed by "-" could only be in the help text, which starts after two
  spaces, where the split stops first.
- the same split's `i + 2 < len(text)` -> `i + 3`: an option string after ", " is two characters at least.
- check_serve_args' `isinstance(nargs, int) and nargs > 1` -> `nargs > 0` or `nargs < 1`: no contract has an
  integer nargs (the recorded ones keep None, "?" or "+"; help text gives none).
- _nearest's `found[0]` -> `found[-1]`: get_close_matches(n=1) returns one match at most.
- value_problems' `continue` for an executor's class qualname -> `break`: --distributed-executor-backend takes
  one value, so check_serve_args (the one caller) passes a list of one and nothing follows it.
- check_serve_args' `isinstance(argv, str) or not isinstance(argv, (list, tuple))` without its first clause:
  a str is not a list or a tuple, so the second clause refuses it too.
"""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import contract_from_help

HELP = """usage: vllm serve [model_tag] [options]

options:
  --model MODEL         Name or path of the Hugging Face model to use.
  --quantization {awq,fp8,None}, -q {awq,fp8,None}
                        Method used to quantize the weights.
  -tp TENSOR_PARALLEL_SIZE, --tensor-parallel-size TENSOR_PARALLEL_SIZE
                        Number of tensor parallel groups.
  --enforce-eager, --no-enforce-eager  Always use eager-mode PyTorch.
"""


def test_a_short_alias_after_the_long_option_is_its_alias():
    options = contract_from_help(HELP, "9.9.9", env_vars=[])["serve_options"]
    assert options["--quantization"] == {
        "takes_value": True,
        "choices": ["awq", "fp8", "None"],
        "aliases": ["-q"],
        "nargs": None,
        "metavar_values": None,
    }
    assert options["--tensor-parallel-size"]["aliases"] == ["-tp"]
    assert options["--enforce-eager"] == {
        "takes_value": False,
        "choices": None,
        "aliases": ["--no-enforce-eager"],
        "nargs": None,
        "metavar_values": None,
    }
    assert contract_from_help(HELP, "9.9.9", env_vars=[])["value_sets"]["quantization"] == ["awq", "fp8"]


def test_vllm_serve_takes_one_model_after_vllm_serve():
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
        load_contract,
    )

    v019 = load_contract("0.19.0")
    assert check_serve_args(["vllm", "serve", "org/model", "--tensor-parallel-size", "2"], {}, v019) == []
    assert check_serve_args(["serve", "org/model"], {}, v019) == []
    two = "vLLM 0.19.0 `vllm serve` takes one model, got 2 positional arguments"
    assert check_serve_args(["vllm", "serve", "org/model", "other/model"], {}, v019) == [two]
    # argparse takes "-5" for a positional, not an option, when no option looks like a negative number
    assert check_serve_args(["org/model", "-5"], {}, v019) == [two]


def test_a_bare_O_at_the_end_is_refused_not_crashed_on():
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
        load_contract,
    )

    v019 = load_contract("0.19.0")
    assert check_serve_args(["org/model", "-O"], {}, v019) == [
        "-O: unrecognized argument for vLLM 0.19.0 `vllm serve` (it would exit 2)"
    ]
    assert check_serve_args(["org/model", "-O", "3"], {}, v019) == []


def test_an_unknown_option_written_with_its_value_does_not_swallow_the_model():
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
        load_contract,
    )

    problems = check_serve_args(["--no-such-option=1", "org/model", "other/model"], {}, load_contract("0.19.0"))
    assert problems[0].startswith("--no-such-option: unrecognized argument for vLLM 0.19.0 `vllm serve`")
    assert problems[1:] == ["vLLM 0.19.0 `vllm serve` takes one model, got 2 positional arguments"]


def test_a_contract_read_from_help_text_knows_no_types_and_refuses_no_json_key():
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
    )

    parsed = contract_from_help(HELP, "9.9.9", env_vars=[])
    assert check_serve_args(["org/model", "--enforce-eager.level", "1"], {}, parsed) == []


def test_an_optional_value_and_a_negative_value_are_read_as_argparse_reads_them():
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
        load_contract,
    )

    v019 = load_contract("0.19.0")
    # --hf-token takes its value optionally (nargs '?'): alone, before another option, or with a value.
    assert check_serve_args(["org/model", "--hf-token"], {}, v019) == []
    assert check_serve_args(["--hf-token", "--tensor-parallel-size", "2", "org/model"], {}, v019) == []
    assert check_serve_args(["--hf-token", "hf_x", "org/model"], {}, v019) == []
    # a value that looks like a negative number is a value (vLLM's --max-model-len -1: the model's own length)
    assert check_serve_args(["org/model", "--max-model-len", "-1"], {}, v019) == []
    assert check_serve_args(["org/model", "--max-model-len"], {}, v019) == [
        "--max-model-len: expects a value in vLLM 0.19.0, none given (it would exit 2)"
    ]


def test_has_choice_answers_for_a_flag_a_free_value_and_a_value_set():
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        has_choice,
        load_contract,
    )

    v019 = load_contract("0.19.0")
    assert has_choice(v019, "--max-model-len", "4096") is True  # no choices: any value
    assert has_choice(v019, "--kv-cache-dtype", "fp8") is True
    assert has_choice(v019, "--kv-cache-dtype", "bogus") is False
    assert has_choice(v019, "--enforce-eager", "x") is False  # a flag takes no value
    assert has_choice(v019, "--no-such-option", "x") is False


def test_a_typo_gets_its_nearest_option_and_an_executor_class_is_taken_by_its_qualname():
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
        load_contract,
    )

    v019 = load_contract("0.19.0")
    assert check_serve_args(["org/model", "--max-model-le", "1"], {}, v019) == [
        "--max-model-le: unrecognized argument for vLLM 0.19.0 `vllm serve` (it would exit 2); "
        "did you mean --max-model-len?"
    ]
    assert check_serve_args(["org/model", "--distributed-executor-backend", "my.pkg.Executor"], {}, v019) == []
    assert check_serve_args(["org/model", "--distributed-executor-backend", "bogus"], {}, v019) == [
        "--distributed-executor-backend bogus: not a value vLLM 0.19.0 knows (it would fail at engine config, "
        "exit 1); known: external_launcher, mp, ray, uni"
    ]


def test_no_contract_is_refused_with_what_to_pass():
    import pytest  # noqa: PLC0415
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
    )

    for contract in (None, [], {"vllm_version": "0.19.0"}):
        with pytest.raises(ValueError, match=r"^contract must be a vLLM contract dict \(load_contract or contract_"):
            check_serve_args(["org/model"], {}, contract)


def test_every_optimization_level_after_a_bare_O_is_taken():
    """FlexibleArgumentParser reads `-O <n>` as --optimization-level n, for each level 0 to 3."""
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
        load_contract,
    )

    v019 = load_contract("0.19.0")
    for level in ("0", "1", "2", "3"):
        assert check_serve_args(["org/model", "-O", level], {}, v019) == [], level


def test_a_command_line_given_as_a_tuple_is_checked_as_a_list_is():
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
        load_contract,
    )

    v019 = load_contract("0.19.0")
    assert check_serve_args(("vllm", "serve", "org/model", "--tensor-parallel-size", "2"), {}, v019) == []
    assert check_serve_args(("org/model", "--max-model-len"), {}, v019) == [
        "--max-model-len: expects a value in vLLM 0.19.0, none given (it would exit 2)"
    ]


def test_an_option_taking_any_number_of_values_takes_them_all():
    """argparse prints nargs='*' as `--opt [OPT ...]`: every value up to the next option is the option's, none
    is a second model."""
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
    )

    parsed = contract_from_help(HELP + "  --middleware [MIDDLEWARE ...]\n", "9.9.9", env_vars=[])
    assert parsed["serve_options"]["--middleware"]["nargs"] == "*"
    assert (
        check_serve_args(["org/model", "--middleware", "a.B", "c.D", "--tensor-parallel-size", "2"], {}, parsed) == []
    )
    assert check_serve_args(["org/model", "--middleware"], {}, parsed) == []


def test_a_short_alias_a_later_release_dropped_is_said_to_be_an_older_release_s():
    """A newer vLLM without `-tp` (the same setting, --tensor-parallel-size, kept): the check names the last
    recorded release that took the alias and what it is called now."""
    import copy  # noqa: PLC0415

    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
        load_contract,
    )

    later = copy.deepcopy(load_contract("0.33.0"))
    later["vllm_version"] = "0.40.0"
    later["serve_options"]["--tensor-parallel-size"]["aliases"] = []
    assert check_serve_args(["org/model", "-tp", "2"], {}, later) == [
        "-tp: unrecognized argument for vLLM 0.40.0 `vllm serve` (it would exit 2); "
        "vLLM 0.33.0 took it; 0.40.0 renamed it to --tensor-parallel-size"
    ]


def test_a_contract_from_help_has_value_sets_only_for_the_options_its_help_lists():
    """The help of a recorded release (0.19.0) that lists --quantization with its choices and none of the other
    value-set options: the contract takes no value set from the recording for an option this help lacks."""
    parsed = contract_from_help(HELP, "0.19.0", env_vars=[])
    assert parsed["value_sets"] == {
        "quantization": ["awq", "fp8"],
        "kv_cache_dtype": None,
        "attention_backend": None,
        "moe_backend": None,
        "distributed_executor_backend": None,
    }


def test_a_contract_without_value_sets_checks_options_and_refuses_no_value():
    """check_serve_args takes any contract with serve_options; one that has no value_sets knows no values to
    refuse for a free-string option."""
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
    )

    options = {"--quantization": {"takes_value": True, "choices": None, "aliases": ["-q"], "nargs": None}}
    assert check_serve_args(["org/model", "-q", "fp8"], {}, {"vllm_version": "9.9.9", "serve_options": options}) == []


def test_only_the_executor_backend_takes_a_dotted_class_name():
    """A dotted value passes for --distributed-executor-backend (an Executor subclass's qualname); for the other
    value-set options it is a value like any other, refused when the release does not know it."""
    from ansible_collections.sparkops.cluster.plugins.plugin_utils.vllm_contract import (  # noqa: PLC0415
        check_serve_args,
        load_contract,
    )

    v019 = load_contract("0.19.0")
    [problem] = check_serve_args(["org/model", "--quantization", "awq.marlin"], {}, v019)
    assert problem.startswith(
        "--quantization awq.marlin: not a value vLLM 0.19.0 knows (it would fail at engine config, exit 1); "
        "known: awq, "
    )
    [problem] = check_serve_args(["org/model", "--attention-backend", "flash.attn"], {}, v019)
    assert problem.startswith("--attention-backend flash.attn: not a value vLLM 0.19.0 knows")
