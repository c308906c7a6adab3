"""benchmark_report: files written, regressions flagged against the previous run, PNG really a PNG."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from ansible_collections.sparkops.cluster.plugins.modules import benchmark_report
from module_runner import run_module

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _levels(tok_s: dict[int, float]) -> list[dict]:
    return [
        {
            "concurrency": c,
            "requests": 2 * c,
            "completion_tokens": 512 * c,
            "wall_s": 30.0,
            "aggregate_tok_s": v,
            "per_request_tok_s_mean": v / c,
            "ttft_p50_s": 0.4,
            "ttft_p95_s": 0.6,
            "errors": 0,
            "error_samples": [],
            "prefix_cache_hit_rate": 0.9,
        }
        for c, v in tok_s.items()
    ]


def _write_previous(directory, cluster, timestamp, tok_s):
    path = directory / f"{cluster}-{timestamp}.json"
    path.write_text(json.dumps({"cluster_name": cluster, "timestamp": timestamp, "results": _levels(tok_s)}))
    return path


def test_files_written_and_markdown_has_reference(tmp_path):
    res = run_module(
        benchmark_report,
        {
            "results": _levels({1: 17.2, 2: 24.0, 4: 36.0}),
            "output_dir": str(tmp_path / "out"),
            "cluster_name": "two-sparks",
            "timestamp": "20261123T070000Z",
        },
    )
    assert not res.get("failed"), res
    assert res["changed"] is True
    assert res["json_path"] == str(tmp_path / "out" / "two-sparks-20261123T070000Z.json")
    doc = json.loads(Path(res["json_path"]).read_text())
    assert doc["reference"] == {"1": 17.0, "2": 24.1, "4": 36.4}
    assert [r["concurrency"] for r in doc["results"]] == [1, 2, 4]
    md = Path(res["markdown_path"]).read_text()
    assert "reference tok/s" in md and "| 4 | 36.0 |" in md and "| 36.4 |" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 3 and all(row.endswith("| ok |") for row in rows)
    assert res["previous_path"] is None and res["regressions"] == []
    # no previous run: compared with the reference (36.0 vs 36.4 is within 10%)
    assert res["rows"][2]["baseline_kind"] == "reference"


def test_png_written_with_magic_bytes(tmp_path):
    pytest.importorskip("matplotlib")
    res = run_module(
        benchmark_report,
        {"results": _levels({1: 17.0, 2: 24.0}), "output_dir": str(tmp_path), "cluster_name": "c1"},
    )
    assert res["png_skipped"] is None
    with open(res["png_path"], "rb") as fh:
        assert fh.read(8) == PNG_MAGIC
    assert os.path.getsize(res["png_path"]) > 1000


def test_regression_flagged_against_newest_previous(tmp_path):
    _write_previous(tmp_path, "two-sparks", "20261101T000000Z", {1: 5.0, 2: 5.0, 4: 5.0})  # older
    newest = _write_previous(tmp_path, "two-sparks", "20261120T000000Z", {1: 17.0, 2: 24.1, 4: 40.0})
    _write_previous(tmp_path, "two-sparks-b", "20261122T000000Z", {1: 99.0, 2: 99.0, 4: 99.0})  # other cluster
    res = run_module(
        benchmark_report,
        {
            "results": _levels({1: 16.9, 2: 24.0, 4: 30.0}),
            "output_dir": str(tmp_path),
            "cluster_name": "two-sparks",
            "timestamp": "20261123T070000Z",
        },
    )
    assert not res.get("failed"), res
    assert res["previous_path"] == str(newest)
    assert [r["concurrency"] for r in res["regressions"]] == [4]
    reg = res["regressions"][0]
    assert reg["baseline"] == 40.0 and reg["baseline_kind"] == "previous"
    assert reg["change"] == pytest.approx(-0.25)
    md = Path(res["markdown_path"]).read_text()
    row4 = next(line for line in md.splitlines() if line.startswith("| 4 |"))
    assert "REGRESSION" in row4 and "| 40.0 |" in row4 and "-25.0%" in row4
    row1 = next(line for line in md.splitlines() if line.startswith("| 1 |"))
    assert "REGRESSION" not in row1 and row1.endswith("| ok |")


def test_explicit_previous_and_threshold(tmp_path):
    prev = _write_previous(tmp_path, "elsewhere", "20261120T000000Z", {1: 20.0})
    args = {
        "results": _levels({1: 19.0}),
        "output_dir": str(tmp_path / "o"),
        "cluster_name": "c",
        "previous": str(prev),
        "regression_threshold": 0.04,
    }
    res = run_module(benchmark_report, args)
    assert [r["concurrency"] for r in res["regressions"]] == [1]  # -5% with a 4% threshold
    args["regression_threshold"] = 0.10
    args["output_dir"] = str(tmp_path / "o2")
    assert run_module(benchmark_report, args)["regressions"] == []


def test_reference_keys_from_ansible_are_strings(tmp_path):
    res = run_module(
        benchmark_report,
        {
            "results": _levels({1: 10.0}),
            "reference": {"1": 20.0},
            "output_dir": str(tmp_path),
            "cluster_name": "c",
        },
    )
    assert res["regressions"][0]["baseline_kind"] == "reference"
    assert res["regressions"][0]["change"] == pytest.approx(-0.5)


def test_check_mode_writes_nothing(tmp_path):
    res = run_module(
        benchmark_report,
        {"results": _levels({1: 17.0}), "output_dir": str(tmp_path / "never"), "cluster_name": "c"},
        check_mode=True,
    )
    assert res["changed"] is True
    assert not (tmp_path / "never").exists()
    assert res["json_path"].endswith(".json")


def test_no_matplotlib_writes_no_png(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    res = run_module(
        benchmark_report, {"results": _levels({1: 17.0}), "output_dir": str(tmp_path), "cluster_name": "c"}
    )
    assert not res.get("failed"), res
    assert res["png_path"] is None and "matplotlib" in res["png_skipped"]
    assert not list(tmp_path.glob("*.png"))
    assert list(tmp_path.glob("*.md")) and list(tmp_path.glob("*.json"))


def test_bad_inputs_fail(tmp_path):
    res = run_module(benchmark_report, {"results": [{"x": 1}], "output_dir": str(tmp_path), "cluster_name": "c"})
    assert res["failed"] and "concurrency" in res["msg"]
    res = run_module(benchmark_report, {"results": [], "output_dir": str(tmp_path), "cluster_name": "../c"})
    assert res["failed"] and "cluster_name" in res["msg"]
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    res = run_module(
        benchmark_report,
        {"results": _levels({1: 1.0}), "output_dir": str(tmp_path), "cluster_name": "c", "previous": str(broken)},
    )
    assert res["failed"] and "previous run" in res["msg"]


def test_test_double_figures_are_marked_and_never_compared_with_hardware(tmp_path):
    """Issue 16.5: on the simulated cluster the Markdown said `+333.8% ok` against the two-Spark
    reference. With source=test-double every file says whose figures these are, and the hardware
    reference is neither shown nor used; a hardware run in the same folder is not a baseline."""
    out = tmp_path / "out"
    out.mkdir()
    _write_previous(out, "spark-sim", "20261122T070000Z", {1: 17.0, 2: 24.1, 4: 36.4})  # a hardware-era file
    res = run_module(
        benchmark_report,
        {
            "results": _levels({1: 73.8, 2: 147.0, 4: 290.1}),
            "output_dir": str(out),
            "cluster_name": "spark-sim",
            "timestamp": "20261123T070000Z",
            "source": "test-double",
            "model": "sim-tiny",
        },
    )
    assert not res.get("failed"), res
    assert res["source"] == "test-double"
    assert res["previous_path"] is None, "a hardware run must not be the test double's baseline"
    doc = json.loads(Path(res["json_path"]).read_text())
    assert doc["source"] == "test-double" and doc["reference"] is None and doc["model"] == "sim-tiny"
    assert all(r["reference"] is None and r["change"] is None for r in doc["rows"])
    md = Path(res["markdown_path"]).read_text()
    assert md.splitlines()[0].endswith(": vLLM TEST DOUBLE")
    assert "reference tok/s" not in md and "36.4" not in md and "%" not in md.split("| flag |")[1].replace("90.0%", "")
    assert "not compared with the two-Spark reference" in md and "`sim-tiny`" in md
    png = Path(res["png_path"]).read_bytes()
    assert png.startswith(PNG_MAGIC)

    # A second double run compares with the first double run only.
    res2 = run_module(
        benchmark_report,
        {
            "results": _levels({1: 30.0, 2: 147.0, 4: 290.1}),
            "output_dir": str(out),
            "cluster_name": "spark-sim",
            "timestamp": "20261123T080000Z",
            "source": "test-double",
        },
    )
    assert res2["previous_path"] == res["json_path"]
    assert [r["concurrency"] for r in res2["regressions"]] == [1]
    assert res2["regressions"][0]["baseline_kind"] == "previous"


def test_png_title_names_the_source(tmp_path, monkeypatch):
    """The chart carries the source in its title (and a TEST DOUBLE mark), read back from the figure."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    titles, texts = [], []
    real_savefig = plt.Figure.savefig

    def spy(fig, *args, **kwargs):
        titles.append(" ".join(ax.get_title() + ax.get_title(loc="left") for ax in fig.axes))
        for ax in fig.axes:
            texts.extend(t.get_text() for t in ax.texts)
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    for source in ("hardware", "test-double"):
        run_module(
            benchmark_report,
            {
                "results": _levels({1: 20.0}),
                "output_dir": str(tmp_path / source),
                "cluster_name": "c",
                "source": source,
            },
        )
    assert "measured on hardware" in titles[0] and "TEST DOUBLE" not in titles[0]
    assert "vLLM TEST DOUBLE" in titles[1] and "TEST DOUBLE" in texts


def test_printed_paths_have_no_dot_dot(tmp_path):
    (tmp_path / "a").mkdir()
    res = run_module(
        benchmark_report,
        {"results": _levels({1: 20.0}), "output_dir": str(tmp_path / "a" / ".." / "reports"), "cluster_name": "c"},
    )
    assert ".." not in res["json_path"] and res["json_path"].startswith(str(tmp_path / "reports"))


def test_spec_decode_acceptance_is_reported_only_for_a_spec_decode_profile(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    drawn = []
    real_savefig = plt.Figure.savefig

    def spy(fig, *args, **kwargs):
        drawn.append({ax.get_title(loc="left"): [list(ln.get_ydata()) for ln in ax.get_lines()] for ax in fig.axes})
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    levels = _levels({1: 24.0, 4: 63.9})
    plain = run_module(
        benchmark_report,
        {"results": levels, "output_dir": str(tmp_path / "a"), "cluster_name": "one", "timestamp": "20261125T010000Z"},
    )
    assert "Speculative decoding" not in Path(plain["markdown_path"]).read_text()
    levels[0]["spec_decode"] = {
        "drafts": 400,
        "draft_tokens": 800,
        "accepted_tokens": 504,
        "acceptance_rate": 0.63,
        "mean_acceptance_length": 2.26,
        "per_position": [0.75, 0.51],
    }
    res = run_module(
        benchmark_report,
        {"results": levels, "output_dir": str(tmp_path / "b"), "cluster_name": "one", "timestamp": "20261125T010000Z"},
    )
    assert not res.get("failed"), res
    md = Path(res["markdown_path"]).read_text()
    assert "| 1 | 63.0% | 2.26 | 75%, 51% | 400 |" in md
    assert "| 4 | " not in md.split("Speculative decoding")[1]  # level 4 had no counters
    doc = json.loads(Path(res["json_path"]).read_text())
    assert doc["rows"][0]["spec_decode"]["acceptance_rate"] == 0.63
    assert res["rows"][0]["spec_decode"]["mean_acceptance_length"] == 2.26
    assert res["rows"][1]["spec_decode"] is None
    # the chart: three panels without counters, a fourth with the acceptance rate (percent) when present
    assert len(drawn[0]) == 3 and len(drawn[1]) == 4
    assert drawn[1]["Draft acceptance (speculative decoding)"][0] == [63.0]


SWEEP = json.loads((Path(__file__).resolve().parents[3] / "fixtures" / "benchmark" / "double-sweep.json").read_text())


def test_capacity_sweep_report_keeps_runs_and_capacity_and_draws_the_slo(tmp_path, monkeypatch):
    """A recorded sweep of the test double (tests/fixtures/benchmark/double-sweep.json, README there) after a
    previous run with max_num_seqs 8: the JSON keeps runs and capacity, the Markdown names the users at SLO,
    and the chart draws this run, the previous one, the seed figures and the SLO lines."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    drawn = {}
    real_savefig = plt.Figure.savefig

    def spy(fig, *args, **kwargs):
        drawn["suptitle"] = fig._suptitle.get_text()
        drawn["lines"] = {
            (i, line.get_label()): list(zip(line.get_xdata(), line.get_ydata(), strict=True))
            for i, ax in enumerate(fig.axes)
            for line in ax.get_lines()
        }
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    out = tmp_path / "out"
    for timestamp, name in (("20261124T070000Z", "max_num_seqs_8"), ("20261125T070000Z", "max_num_seqs_16")):
        sweep = SWEEP[name]
        res = run_module(
            benchmark_report,
            {
                "results": sweep["levels"],
                "runs": sweep["runs"],
                "capacity": sweep["capacity"],
                "output_dir": str(out),
                "cluster_name": "spark-sim",
                "timestamp": timestamp,
                "source": "test-double",
                "model": "qwen3-235b-a22b",
            },
        )
        assert not res.get("failed"), res
    doc = json.loads(Path(res["json_path"]).read_text())
    assert doc["capacity"]["users_at_slo"] == 2 and [r["max_concurrency"] for r in doc["runs"]] == [1, 2, 4, 8, 16]
    assert doc["reference"] is None  # the double is not compared with hardware...
    md = Path(res["markdown_path"]).read_text()
    assert "Capacity: **2 users at SLO** (>= 10 tok/s per user, TTFT p95 <= 2 s); first miss at 4" in md
    assert "Sweep stopped: SLO clearly broken at concurrency 16" in md
    assert drawn["suptitle"].startswith("spark-sim 20261125T070000Z: 2 users at SLO")
    lines = drawn["lines"]
    # ...but the chart shows the seed figures it is paced on: aggregate 36.4 and 9.1 per user at 4
    assert (4, 36.4) in lines[(0, "seed figures (2 Sparks, hardware)")]
    assert (4, 9.1) in lines[(1, "seed figures (2 Sparks, hardware)")]
    previous = dict(lines[(2, "previous run")])
    now = dict(lines[(2, "this run")])
    assert previous[16] > now[16]  # max_num_seqs 8 made 16 users queue
    assert {y for _x, y in lines[(1, "SLO")]} == {10.0} and {y for _x, y in lines[(2, "SLO")]} == {2.0}
    assert {x for x, _y in lines[(0, "users at SLO")]} == {2}
    Path(tmp_path / "chart.png").write_bytes(Path(res["png_path"]).read_bytes())
    assert Path(res["png_path"]).read_bytes().startswith(PNG_MAGIC)
