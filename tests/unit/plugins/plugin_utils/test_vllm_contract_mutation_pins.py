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
- check_serve_args' `isinstance(nargs, int) and nargs > 1` -> `nargs > 0`: no contract has an integer nargs
  (the recorded ones keep None, "?" or "+"; help text gives none).
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
