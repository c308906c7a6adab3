"""roles/monitoring/files/sparkops-textfile-metrics.py: the GPU, watchdog and threshold metrics
the node exporter's textfile collector serves. The output is checked with Prometheus' own
parser (promtool check metrics) where promtool is installed, and by value here."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "roles" / "monitoring" / "files" / "sparkops-textfile-metrics.py"
NVIDIA_SMI = ROOT / "tests" / "fixtures" / "nvidia_smi"


@pytest.fixture(scope="module")
def tf():
    spec = importlib.util.spec_from_file_location("sparkops_textfile_metrics", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def samples(lines: list[str]) -> dict[str, float]:
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines if ln and not ln.startswith("#")}


def test_a_power_capped_gpu_reads_as_throttled_with_clocks_in_hertz(tf):
    got = samples(tf.gpu_lines("0, NVIDIA GB10, 2418, 3003, 0x0000000000000004, 55, 40.12, 93\n"))
    lab = '{gpu="0",name="NVIDIA GB10"}'
    assert got["sparkops_gpu_up"] == 1
    assert got[f"sparkops_gpu_sm_clock_hertz{lab}"] == 2418e6
    assert got[f"sparkops_gpu_sm_clock_max_hertz{lab}"] == 3003e6
    assert got[f"sparkops_gpu_clock_event_reasons{lab}"] == 4
    assert got[f"sparkops_gpu_clock_throttled{lab}"] == 1
    assert got[f"sparkops_gpu_utilization_ratio{lab}"] == pytest.approx(0.93)


def test_an_idle_gpu_is_not_throttled_and_na_fields_are_left_out(tf):
    # GpuIdle (0x1) is a clock event reason but not a slowdown; GB10 reports some fields as [N/A]
    # (tests/fixtures/nvidia_smi/gb10_580.159.03_query_memory.csv shows the notation).
    got = samples(tf.gpu_lines("0, NVIDIA GB10, 208, 3003, 0x0000000000000001, 36, [N/A], 0\n"))
    assert got['sparkops_gpu_clock_throttled{gpu="0",name="NVIDIA GB10"}'] == 0
    assert not any(k.startswith("sparkops_gpu_power_watts") for k in got)


def test_the_na_notation_of_a_recorded_gb10_row_is_read_as_missing(tf):
    row = (NVIDIA_SMI / "gb10_580.159.03_query_memory.csv").read_text().splitlines()[-1]
    assert "[N/A]" in row
    assert tf._number(row.split(",")[-1]) is None


def test_no_nvidia_smi_says_no_gpu(tf):
    assert samples(tf.gpu_lines(None)) == {"sparkops_gpu_up": 0}
    assert samples(tf.gpu_lines("")) == {"sparkops_gpu_up": 0}


def test_watchdog_restarts_are_counted_from_the_jsonl(tf, tmp_path):
    log = tmp_path / "watchdog.jsonl"
    assert samples(tf.watchdog_lines(log))["sparkops_watchdog_restarts_total"] == 0
    log.write_text(
        "\n".join(
            [
                # The shape roles/watchdog's Events.emit writes (h-day2's sparkops_watchdog.py).
                json.dumps({"epoch": 100.5, "event": "restart_begun", "message": "restart 1", "node": "h", "ts": "x"}),
                json.dumps({"epoch": 150, "event": "probe_ok", "message": "ok", "node": "h", "ts": "x"}),
                "not json",
                json.dumps({"epoch": 200, "event": "restart_begun", "message": "restart 2", "node": "h", "ts": "x"}),
                json.dumps({"epoch": 210, "event": "restart_ended", "message": "done", "node": "h", "ts": "x"}),
            ]
        )
    )
    got = samples(tf.watchdog_lines(log))
    assert got["sparkops_watchdog_restarts_total"] == 2
    assert got["sparkops_watchdog_last_restart_timestamp_seconds"] == 200


def test_one_run_writes_three_files_that_prometheus_parses(tf, tmp_path):
    out = tmp_path / "textfile"
    out.mkdir()
    weights = tmp_path / "hf" / "not-yet-made"
    rc = tf.main(
        [
            "--textfile-dir", str(out), "--watchdog-log", str(tmp_path / "none.jsonl"),
            "--weights-dir", str(weights), "--weights-min-free-bytes", "5", "--memory-floor-bytes", "7",
        ]
    )  # fmt: skip
    assert rc == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["sparkops_gpu.prom", "sparkops_thresholds.prom", "sparkops_watchdog.prom"]
    thresholds = samples((out / "sparkops_thresholds.prom").read_text().splitlines())
    assert thresholds["sparkops_memory_floor_bytes"] == 7
    # The weights folder does not exist yet: its nearest existing parent's file system is measured.
    assert thresholds[f'sparkops_weights_disk_size_bytes{{path="{weights}"}}'] == shutil.disk_usage(tmp_path).total
    free = thresholds[f'sparkops_weights_disk_avail_bytes{{path="{weights}"}}']
    assert free == pytest.approx(shutil.disk_usage(tmp_path).free, rel=0.01)
    if shutil.which("promtool"):
        for f in out.iterdir():
            cmd = ["promtool", "check", "metrics"]
            res = subprocess.run(cmd, input=f.read_text(), capture_output=True, text=True, check=False)
            assert res.returncode == 0, (f.name, res.stdout, res.stderr)


def test_a_missing_textfile_folder_is_refused(tf, tmp_path, capsys):
    rc = tf.main(
        [
            "--textfile-dir", str(tmp_path / "nope"), "--watchdog-log", "x", "--weights-dir", str(tmp_path),
            "--weights-min-free-bytes", "1", "--memory-floor-bytes", "1",
        ]
    )  # fmt: skip
    assert rc == 2
    assert "install the node exporter" in capsys.readouterr().err


def test_a_watchdog_that_stopped_restarting_is_a_gauge_until_serving_is_back(tf, tmp_path):
    """issue 43: the WatchdogStoppedRestarting alert reads this gauge; the events are what sparkops_watchdog.py's
    give_up / retry_after_budget write."""
    log = tmp_path / "watchdog.jsonl"

    def write(*recs):
        log.write_text("\n".join(json.dumps({"node": "h", "ts": "x", "message": "m", **r}) for r in recs) + "\n")

    write({"epoch": 100, "event": "restart_begun"}, {"epoch": 110, "event": "restart_ended", "ok": False})
    assert samples(tf.watchdog_lines(log))["sparkops_watchdog_stopped_restarting"] == 0
    write({"epoch": 200, "event": "gave_up", "next_retry_epoch": 800.0})
    got = samples(tf.watchdog_lines(log))
    assert (
        got["sparkops_watchdog_stopped_restarting"] == 1
        and got["sparkops_watchdog_next_retry_timestamp_seconds"] == 800
    )
    write(
        {"epoch": 200, "event": "gave_up", "next_retry_epoch": 800.0},
        {"epoch": 800, "event": "retry_after_budget"},
        {"epoch": 801, "event": "restart_begun"},
        {"epoch": 900, "event": "restart_ended", "ok": False},
        {"epoch": 901, "event": "retry_scheduled", "next_retry_epoch": 2101.0},
    )
    got = samples(tf.watchdog_lines(log))
    assert (
        got["sparkops_watchdog_stopped_restarting"] == 1
        and got["sparkops_watchdog_next_retry_timestamp_seconds"] == 2101
    )
    write({"epoch": 200, "event": "gave_up", "next_retry_epoch": 800.0}, {"epoch": 300, "event": "recovered"})
    got = samples(tf.watchdog_lines(log))
    assert (
        got["sparkops_watchdog_stopped_restarting"] == 0 and got["sparkops_watchdog_next_retry_timestamp_seconds"] == 0
    )


def test_the_last_quality_judgement_is_the_gauge_and_wrong_ones_are_counted(tf, tmp_path):
    log = tmp_path / "watchdog.jsonl"
    log.write_text("")
    got = samples(tf.watchdog_lines(log))
    assert "sparkops_quality_ok" not in got and got["sparkops_quality_failures_total"] == 0  # none judged yet

    def ev(event: str, mean, **kw) -> str:
        return json.dumps({"epoch": 1, "event": event, "message": "m", "node": "h", "mean_logprob": mean, **kw})

    log.write_text("\n".join([ev("quality_baseline", -1.8), ev("quality_ok", -1.8), ev("quality_failed", -10.4)]))
    got = samples(tf.watchdog_lines(log))
    assert got["sparkops_quality_ok"] == 0 and got["sparkops_quality_mean_logprob"] == -10.4
    assert got["sparkops_quality_failures_total"] == 1
    log.write_text(log.read_text() + "\n" + ev("quality_error", None) + "\n" + ev("quality_ok", -1.79))
    got = samples(tf.watchdog_lines(log))
    assert got["sparkops_quality_ok"] == 1 and got["sparkops_quality_mean_logprob"] == -1.79
    assert got["sparkops_quality_failures_total"] == 1
