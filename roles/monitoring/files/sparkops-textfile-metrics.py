#!/usr/bin/env python3
"""Write sparkops' own metrics for the node exporter's textfile collector.

Runs on every node (installed by the monitoring role), once or in a loop:
  sparkops-textfile-metrics --textfile-dir /var/lib/prometheus/node-exporter \
      --watchdog-log /var/lib/sparkops/watchdog.jsonl --weights-dir /var/lib/sparkops/huggingface \
      --weights-min-free-bytes N --memory-floor-bytes N [--interval 15]

GPU (from nvidia-smi; DCGM is not used: it does not report a GB10 properly, see the role's README):
  sparkops_gpu_up                      1 when nvidia-smi answered with at least one GPU, else 0
  sparkops_gpu_sm_clock_hertz          SM clock now
  sparkops_gpu_sm_clock_max_hertz      SM clock maximum
  sparkops_gpu_clock_event_reasons     the active clock event (throttle) reasons, NVML bit mask
  sparkops_gpu_clock_throttled         1 when a slowdown reason (power cap, thermal, HW slowdown,
                                       power brake) is active, else 0 (idle is not throttling)
  sparkops_gpu_temperature_celsius, sparkops_gpu_power_watts, sparkops_gpu_utilization_ratio
Watchdog (from the watchdog's JSON-lines log; one object a line, a restart is "event": "restart_begun"):
  sparkops_watchdog_restarts_total     restarts recorded in the log
  sparkops_watchdog_last_restart_timestamp_seconds
  sparkops_watchdog_stopped_restarting 1 while the watchdog has spent its restart budget and serving is not
                                       back ("gave_up" logged, no "recovered" nor successful restart since)
  sparkops_watchdog_next_retry_timestamp_seconds  when it tries again (0 when it has not stopped)
  sparkops_quality_ok                  1 when the last judgement of the answers was right, 0 when wrong
                                       (absent before the first one: "quality_ok" / "quality_failed" logged)
  sparkops_quality_mean_logprob        the reference passage's mean log-likelihood at the last judgement
  sparkops_quality_failures_total      judgements that found the answers wrong
Thresholds the alert rules compare with (one source of truth: the role's variables):
  sparkops_weights_disk_avail_bytes, sparkops_weights_disk_size_bytes, sparkops_weights_disk_min_free_bytes
  sparkops_memory_floor_bytes
Each file is written to a temporary name and renamed, so the collector never reads half a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

GPU_QUERY = "index,name,clocks.sm,clocks.max.sm,clocks_event_reasons.active,temperature.gpu,power.draw,utilization.gpu"
# NVML clocks event reasons that slow the GPU down (nvml.h: SwPowerCap 0x4, HwSlowdown 0x8,
# SwThermalSlowdown 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80). GpuIdle (0x1),
# ApplicationsClocksSetting (0x2), SyncBoost (0x10) and DisplayClockSetting (0x100) are not slowdowns.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


def _number(text: str) -> float | None:
    text = text.strip()
    if not text or text.startswith("[") or text in ("N/A", "Not Supported"):
        return None
    try:
        return float(int(text, 16)) if text.lower().startswith("0x") else float(text)
    except ValueError:
        return None


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def gpu_lines(csv_text: str | None) -> list[str]:
    """Prometheus text lines from `nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits`.

    None (nvidia-smi missing or failed) gives sparkops_gpu_up 0 and nothing else.
    Fields nvidia-smi reports as [N/A] (GB10 has no separate memory, some fields are N/A) are left out.
    """
    out = [
        "# HELP sparkops_gpu_up 1 when nvidia-smi answered with at least one GPU.",
        "# TYPE sparkops_gpu_up gauge",
    ]
    rows = [r for r in (csv_text or "").splitlines() if r.strip()]
    if csv_text is None or not rows:
        return [*out, "sparkops_gpu_up 0"]
    out.append("sparkops_gpu_up 1")
    families = {
        "sparkops_gpu_sm_clock_hertz": ("SM clock now.", []),
        "sparkops_gpu_sm_clock_max_hertz": ("SM clock maximum.", []),
        "sparkops_gpu_clock_event_reasons": ("Active clock event reasons (NVML bit mask).", []),
        "sparkops_gpu_clock_throttled": ("1 when a slowdown clock event reason is active.", []),
        "sparkops_gpu_temperature_celsius": ("GPU temperature.", []),
        "sparkops_gpu_power_watts": ("GPU power draw.", []),
        "sparkops_gpu_utilization_ratio": ("GPU utilisation (0-1).", []),
    }
    for row in rows:
        cells = [c.strip() for c in row.split(",")]
        if len(cells) != len(GPU_QUERY.split(",")):
            continue
        index, name, sm, sm_max, reasons, temp, power, util = cells
        labels = f'gpu="{_label(index)}",name="{_label(name)}"'
        values = {
            "sparkops_gpu_sm_clock_hertz": None if _number(sm) is None else _number(sm) * 1e6,
            "sparkops_gpu_sm_clock_max_hertz": None if _number(sm_max) is None else _number(sm_max) * 1e6,
            "sparkops_gpu_clock_event_reasons": _number(reasons),
            "sparkops_gpu_clock_throttled": None
            if _number(reasons) is None
            else float(bool(int(_number(reasons)) & THROTTLE_MASK)),
            "sparkops_gpu_temperature_celsius": _number(temp),
            "sparkops_gpu_power_watts": _number(power),
            "sparkops_gpu_utilization_ratio": None if _number(util) is None else _number(util) / 100,
        }
        for metric, value in values.items():
            if value is not None:
                families[metric][1].append(f"{metric}{{{labels}}} {value:g}")
    for metric, (help_text, samples) in families.items():
        if samples:
            out += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge", *samples]
    return out


def watchdog_lines(log_path: Path) -> list[str]:
    restarts, last = 0, 0.0
    stopped, next_retry = 0, 0.0
    quality_ok, quality_mean, quality_failures = None, None, 0
    try:
        text = log_path.read_text(errors="replace")
    except FileNotFoundError:
        text = ""
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        # The watchdog (roles/watchdog) logs {"epoch": <Unix s>, "event": "restart_begun", ...}
        # once per restart of the serving group.
        if not isinstance(rec, dict):
            continue
        event = rec.get("event")
        if event == "restart_begun":
            restarts += 1
            epoch = rec.get("epoch")
            if isinstance(epoch, (int, float)):
                last = max(last, float(epoch))
        # The watchdog logs "gave_up" when the hour's restarts are spent and "retry_scheduled" after a try
        # that failed (both with next_retry_epoch); "recovered" or a restart that ended ok means serving is back.
        elif event in ("gave_up", "retry_scheduled"):
            stopped = 1
            when = rec.get("next_retry_epoch")
            next_retry = float(when) if isinstance(when, (int, float)) else next_retry
        elif event == "recovered" or (event == "restart_ended" and rec.get("ok") is True):
            stopped, next_retry = 0, 0.0
        # The watchdog's quality thread: a right or a wrong judgement of the answers, with the passage's figure.
        if event in ("quality_ok", "quality_failed"):
            quality_ok = 1 if event == "quality_ok" else 0
            quality_failures += event == "quality_failed"
            mean = rec.get("mean_logprob")
            quality_mean = float(mean) if isinstance(mean, (int, float)) and not isinstance(mean, bool) else None
    quality = []
    if quality_ok is not None:
        quality += [
            "# HELP sparkops_quality_ok 1 when the last judgement of the answers was right, 0 when wrong.",
            "# TYPE sparkops_quality_ok gauge",
            f"sparkops_quality_ok {quality_ok}",
        ]
    if quality_mean is not None:
        quality += [
            "# HELP sparkops_quality_mean_logprob The reference passage's mean log-likelihood at the last judgement.",
            "# TYPE sparkops_quality_mean_logprob gauge",
            f"sparkops_quality_mean_logprob {quality_mean:g}",
        ]
    quality += [
        "# HELP sparkops_quality_failures_total Judgements that found the answers wrong.",
        "# TYPE sparkops_quality_failures_total counter",
        f"sparkops_quality_failures_total {quality_failures}",
    ]
    return quality + [
        "# HELP sparkops_watchdog_restarts_total Restarts the sparkops watchdog recorded.",
        "# TYPE sparkops_watchdog_restarts_total counter",
        f"sparkops_watchdog_restarts_total {restarts}",
        "# HELP sparkops_watchdog_last_restart_timestamp_seconds When the watchdog last restarted something.",
        "# TYPE sparkops_watchdog_last_restart_timestamp_seconds gauge",
        f"sparkops_watchdog_last_restart_timestamp_seconds {last:g}",
        "# HELP sparkops_watchdog_stopped_restarting 1 while the watchdog has spent its restart budget and serving "
        "is not back.",
        "# TYPE sparkops_watchdog_stopped_restarting gauge",
        f"sparkops_watchdog_stopped_restarting {stopped}",
        "# HELP sparkops_watchdog_next_retry_timestamp_seconds When the watchdog tries again after a spent budget.",
        "# TYPE sparkops_watchdog_next_retry_timestamp_seconds gauge",
        f"sparkops_watchdog_next_retry_timestamp_seconds {next_retry:g}",
    ]


def threshold_lines(weights_dir: Path, weights_min_free: int, memory_floor: int) -> list[str]:
    out = [
        "# HELP sparkops_memory_floor_bytes Available memory below which the node is at risk.",
        "# TYPE sparkops_memory_floor_bytes gauge",
        f"sparkops_memory_floor_bytes {memory_floor}",
        "# HELP sparkops_weights_disk_min_free_bytes Free space the weights' file system must keep.",
        "# TYPE sparkops_weights_disk_min_free_bytes gauge",
        f"sparkops_weights_disk_min_free_bytes {weights_min_free}",
    ]
    probe = weights_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    path = _label(str(weights_dir))
    out += [
        "# HELP sparkops_weights_disk_avail_bytes Free space on the weights' file system.",
        "# TYPE sparkops_weights_disk_avail_bytes gauge",
        f'sparkops_weights_disk_avail_bytes{{path="{path}"}} {usage.free}',
        "# HELP sparkops_weights_disk_size_bytes Size of the weights' file system.",
        "# TYPE sparkops_weights_disk_size_bytes gauge",
        f'sparkops_weights_disk_size_bytes{{path="{path}"}} {usage.total}',
    ]
    return out


def read_gpus() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        res = subprocess.run(
            ["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def write_atomic(path: Path, lines: list[str]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.chmod(0o644)
    tmp.replace(path)


def collect(args: argparse.Namespace) -> None:
    out = Path(args.textfile_dir)
    write_atomic(out / "sparkops_gpu.prom", gpu_lines(read_gpus()))
    write_atomic(out / "sparkops_watchdog.prom", watchdog_lines(Path(args.watchdog_log)))
    write_atomic(
        out / "sparkops_thresholds.prom",
        threshold_lines(Path(args.weights_dir), args.weights_min_free_bytes, args.memory_floor_bytes),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--textfile-dir", required=True)
    p.add_argument("--watchdog-log", required=True)
    p.add_argument("--weights-dir", required=True)
    p.add_argument("--weights-min-free-bytes", type=int, required=True)
    p.add_argument("--memory-floor-bytes", type=int, required=True)
    p.add_argument("--interval", type=float, default=0, help="seconds between runs; 0: run once")
    args = p.parse_args(argv)
    if not Path(args.textfile_dir).is_dir():
        print(f"no textfile directory {args.textfile_dir}: install the node exporter first", file=sys.stderr)
        return 2
    if read_gpus() is None:
        print("nvidia-smi did not answer: no GPU here (sparkops_gpu_up 0)", file=sys.stderr, flush=True)
    while True:
        collect(args)
        if args.interval <= 0:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
