"""gpu_facts against stand-in nvidia-smi scripts that print recorded outputs (tests/fixtures/nvidia_smi/README.md):
the H100 / driver 580.159.04 query, banner and /proc/driver/nvidia/version recorded here; GB10 banner and NVRM
line from public DGX Spark notes; the public "couldn't communicate" and NVML-mismatch messages."""

from __future__ import annotations

import shlex

from ansible_collections.sparkops.cluster.plugins.modules import gpu_facts as mod
from conftest import FIXTURES
from module_runner import run_module

SMI = FIXTURES / "nvidia_smi"


def fake_smi(tmp_path, query_text: str, banner_text: str = "", rc: int = 0, name: str = "nvidia-smi") -> str:
    """An executable printing query_text for --query-gpu runs and banner_text otherwise, exiting rc."""
    (tmp_path / "query.out").write_text(query_text)
    (tmp_path / "banner.out").write_text(banner_text)
    q, b = shlex.quote(str(tmp_path / "query.out")), shlex.quote(str(tmp_path / "banner.out"))
    script = tmp_path / name
    script.write_text(f'#!/bin/sh\ncase "$1" in --query-gpu=*) cat {q} ;; *) cat {b} ;; esac\nexit {rc}\n')
    script.chmod(0o755)
    return str(script)


def fx(name: str) -> str:
    return (SMI / name).read_text()


def test_h100_recorded_on_branch(tmp_path):
    smi = fake_smi(tmp_path, fx("h100_580.159.04_query.csv"), fx("h100_580.159.04_nvidia-smi.txt"))
    r = run_module(
        mod,
        {"nvidia_smi_path": smi, "proc_version_path": str(SMI / "h100_580.159.04_proc_version.txt")},
        check_mode=True,
    )
    assert r.get("failed") is not True, r
    assert r["changed"] is False and "ansible_facts" not in r
    assert (r["gpu_present"], r["gpu_count"], r["reason"]) == (True, 1, None)
    assert r["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert r["gpus"][0]["memory_total_mib"] == 81559
    assert (r["driver_version"], r["driver_branch"], r["cuda_driver_version"]) == ("580.159.04", "580", "13.0")
    assert (r["kernel_module_version"], r["kernel_module_flavor"]) == ("580.159.04", "open")
    assert r["kernel_module_matches"] is True
    assert (r["on_branch"], r["branch_reason"], r["expected_branch"]) == (True, None, "580")


def test_gb10_unified_memory_is_null(tmp_path):
    # Row assembled from public GB10 values (name, 580.126.09, compute capability 12.1, [N/A] memory,
    # bus id 0000000F:01:00.0) in gpu_facts' field order; banner and NVRM line are verbatim public samples.
    row = "580.126.09, NVIDIA GB10, 12.1, [N/A], [N/A], 0000000F:01:00.0, GPU-00000000-0000-0000-0000-000000000000, 0\n"
    smi = fake_smi(tmp_path, row, fx("gb10_580.142_nvidia-smi.txt"))
    r = run_module(mod, {"nvidia_smi_path": smi, "proc_version_path": str(SMI / "gb10_580.126.09_proc_version.txt")})
    gpu = r["gpus"][0]
    assert (gpu["compute_capability"], gpu["memory_total_mib"], gpu["memory_used_mib"]) == ("12.1", None, None)
    assert gpu["pci_bus_id"] == "0000000F:01:00.0"
    assert r["kernel_module_matches"] is True and r["on_branch"] is True
    assert r["cuda_driver_version"] == "13.0"


def test_off_branch_590_driver(tmp_path):
    # The recorded H100 row and NVRM line with only the version changed to 590.44.01.
    row = fx("h100_580.159.04_query.csv").replace("580.159.04", "590.44.01")
    proc = tmp_path / "version"
    proc.write_text(fx("h100_580.159.04_proc_version.txt").replace("580.159.04", "590.44.01"))
    smi = fake_smi(tmp_path, row, fx("h100_580.159.04_nvidia-smi.txt").replace("580.159.04", "590.44.01"))
    r = run_module(mod, {"nvidia_smi_path": smi, "proc_version_path": str(proc)})
    assert r.get("failed") is not True, r
    assert (r["driver_branch"], r["on_branch"]) == ("590", False)
    assert "590.44.01 is not on the 580 branch" in r["branch_reason"]
    ok = run_module(mod, {"nvidia_smi_path": smi, "proc_version_path": str(proc), "expected_branch": "590"})
    assert ok["on_branch"] is True


def test_userspace_on_branch_but_kernel_module_not(tmp_path):
    proc = tmp_path / "version"
    proc.write_text(fx("h100_580.159.04_proc_version.txt").replace("580.159.04", "590.44.01"))
    smi = fake_smi(tmp_path, fx("h100_580.159.04_query.csv"), fx("h100_580.159.04_nvidia-smi.txt"))
    r = run_module(mod, {"nvidia_smi_path": smi, "proc_version_path": str(proc)})
    assert r["kernel_module_matches"] is False
    assert r["on_branch"] is False and "590.44.01" in r["branch_reason"]


def test_nvidia_smi_missing_is_no_gpu_not_failure(tmp_path):
    r = run_module(mod, {"nvidia_smi_path": str(tmp_path / "nope"), "proc_version_path": str(tmp_path / "none")})
    assert r.get("failed") is not True, r
    assert (r["gpu_present"], r["gpu_count"], r["gpus"]) == (False, 0, [])
    assert "not found" in r["reason"]
    assert r["kernel_module_version"] is None and r["on_branch"] is False


def test_cannot_communicate_with_driver_is_no_gpu(tmp_path):
    smi = fake_smi(tmp_path, fx("no_driver.txt"), fx("no_driver.txt"), rc=9)
    r = run_module(mod, {"nvidia_smi_path": smi, "proc_version_path": str(tmp_path / "none")})
    assert r.get("failed") is not True, r
    assert r["gpu_present"] is False
    assert "couldn't communicate with the NVIDIA driver" in r["reason"]


def test_driver_library_mismatch_fails_with_fix(tmp_path):
    smi = fake_smi(tmp_path, fx("nvml_mismatch.txt"), rc=18)
    r = run_module(mod, {"nvidia_smi_path": smi, "proc_version_path": str(SMI / "gb10_580.126.09_proc_version.txt")})
    assert r["failed"] is True
    assert "NVML library 580.126" in r["msg"] and "580.126.09" in r["msg"]
    assert "reboot" in r["msg"]


def test_unexpected_error_output_fails(tmp_path):
    smi = fake_smi(tmp_path, fx("h100_580.159.04_bad_field.txt"), rc=2)
    r = run_module(mod, {"nvidia_smi_path": smi, "proc_version_path": str(tmp_path / "none")})
    assert r["failed"] is True
    assert 'failed (rc=2): Field "foo" is not a valid field to query.' in r["msg"]


def test_unparsable_rows_fail(tmp_path):
    smi = fake_smi(tmp_path, fx("gb10_580.159.03_query_memory.csv"))
    r = run_module(mod, {"nvidia_smi_path": smi, "proc_version_path": str(tmp_path / "none")})
    assert r["failed"] is True and "expected 8 comma-separated values" in r["msg"]


def test_argument_errors(tmp_path):
    r = run_module(mod, {"expected_branch": "r580"})
    assert r["failed"] is True and "expected_branch must be a driver branch number" in r["msg"]
    r = run_module(mod, {"timeout_s": 0})
    assert r["failed"] is True and "timeout_s must be positive" in r["msg"]
    r = run_module(mod, {"nvidia_smi": "x"})
    assert r["failed"] is True and "nvidia_smi" in r["msg"]


def test_packages_are_read_from_this_hosts_dpkg(tmp_path):
    # The real dpkg-query of the machine running the tests (Debian): dpkg itself is installed.
    r = run_module(mod, {"nvidia_smi_path": str(tmp_path / "none"), "packages": ["dpkg", "sparkops-no-such-package"]})
    assert r.get("failed") is not True, r
    assert set(r["packages"]) == {"dpkg"}
    assert r["packages"]["dpkg"]["installed"] is True and r["packages"]["dpkg"]["version"]


def test_held_and_removed_driver_packages(tmp_path, monkeypatch):
    # What dpkg-query -W -f='${Package}\t${Version}\t${db:Status-Want}\t${db:Status-Status}\n' prints for a
    # held driver, a package whose files were removed (config-files) and one dpkg never saw (stderr, exit 1).
    fake = tmp_path / "dpkg-query"
    fake.write_text(
        "#!/bin/sh\n"
        "printf 'nvidia-driver-580-open\\t580.95.05-0ubuntu1\\thold\\tinstalled\\n'\n"
        "printf 'nvidia-dkms-580-open\\t580.95.05-0ubuntu1\\tdeinstall\\tconfig-files\\n'\n"
        "echo 'dpkg-query: no packages found matching libnvidia-x' >&2\n"
        "exit 1\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    r = run_module(
        mod,
        {
            "nvidia_smi_path": str(tmp_path / "none"),
            "packages": ["nvidia-driver-580-open", "nvidia-dkms-580-open", "libnvidia-x"],
        },
    )
    assert r["packages"] == {
        "nvidia-driver-580-open": {"version": "580.95.05-0ubuntu1", "selection": "hold", "installed": True},
        "nvidia-dkms-580-open": {"version": "580.95.05-0ubuntu1", "selection": "deinstall", "installed": False},
    }
    # the role's verdicts, ready-made: two packages missing (one removed, one never seen), one held
    assert r["installed"] == {"nvidia-driver-580-open": "580.95.05-0ubuntu1"}
    assert r["held"] == ["nvidia-driver-580-open"] and r["unheld"] == ["nvidia-dkms-580-open", "libnvidia-x"]
    assert r["packages_not_on_branch"] == ["nvidia-dkms-580-open", "libnvidia-x"]
    assert r["install_needed"] is True and r["off_branch"] is False


def test_query_gpu_false_reads_packages_only_and_never_runs_nvidia_smi(tmp_path):
    # After a driver package changed, nvidia-smi fails (library mismatch) until the reboot: not asked.
    smi = fake_smi(tmp_path, "", "Failed to initialize NVML: Driver/library version mismatch\n", rc=18)
    r = run_module(mod, {"nvidia_smi_path": smi, "query_gpu": False, "packages": ["dpkg"]})
    assert r.get("failed") is not True, r
    assert r["gpu_present"] is False and "not asked" in r["reason"]
    assert r["packages"]["dpkg"]["installed"] is True


def test_the_pin_file_is_judged_against_what_the_role_would_write(tmp_path):
    import hashlib  # noqa: PLC0415

    pin = tmp_path / "sparkops-nvidia-driver-pin"
    pin.write_text("Package: nvidia-*\n")
    pin.chmod(0o644)
    want = {"path": str(pin), "mode": "0644", "sha1": hashlib.sha1(b"Package: nvidia-*\n").hexdigest()}  # noqa: S324
    args = {"nvidia_smi_path": str(tmp_path / "none"), "files_wanted": [want]}
    assert run_module(mod, args)["files_stale"] == []
    pin.chmod(0o600)
    assert run_module(mod, args)["files_stale"] == [str(pin)]
    r = run_module(mod, dict(args, files_wanted=[dict(want, mode="u+rw")]))
    assert r["failed"] is True and "is not an octal mode" in r["msg"]
