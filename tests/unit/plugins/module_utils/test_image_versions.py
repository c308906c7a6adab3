"""image_versions: the in-image probe, its parser and the pin/lock comparison."""

from __future__ import annotations

import importlib.metadata as md
import json
import subprocess
import sys

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import image_versions as iv

PINS = {"vllm": "0.19.0", "flashinfer": "0.6.6", "cuda": "13.2", "ray": "2.52.1", "torch": None, "nccl": None}
# The shipped pins (roles/sparkops_defaults/defaults/main/versions.yml): v0.19.0 is commit 2a69949bd.
COMMIT_PINS = {**PINS, "vllm_commit": "2a69949bd"}
# What eugr's build of --vllm-ref v0.19.0 reports (a dirty tree at the tag, CUDA 13.2): issue 22.
EUGR_V0190 = "0.19.1.dev0+g2a69949bd.d20260410.cu132"
# One of eugr's prebuilt wheels (the same scheme on main, CUDA 13.1): issue 22.
EUGR_PREBUILT = "0.16.1rc1.dev296+ga73af584f.d20260305.cu131"
# FlashInfer v0.6.6's own CUTLASS (NVIDIA/cutlass f3fde58, its tag's submodule; the PyPI wheel's headers) and
# the one eugr's first build ships (FlashInfer main's on 2026-04-10, cutlass da5e086): module_utils/image_versions.py.
OWN_CUTLASS = "4.2.1+sha256:2666672a2db624fd"
MAIN_CUTLASS = "4.4.2+sha256:0c021aa4c41ed6dd"
FOUND = {
    "vllm": "0.19.0+cu132",
    "torch": "2.12.0.dev20260410+cu130",
    "cuda": "13.2.0",
    "flashinfer": "0.6.6",
    "ray": "2.52.1",
    "nccl": "2.28.9",
}


@pytest.mark.parametrize(
    ("pin", "found", "ok"),
    [
        ("0.19.0", "0.19.0", True),
        ("0.19.0", "0.19.0+cu132", True),  # vLLM's setup.py labels a non-default CUDA build
        ("13.2", "13.2.0", True),
        ("13.2", "13.2.1", True),
        ("0.19.0", "0.19.0.dev5", False),  # a dev build of main is not the release
        ("0.19.0", "0.19.0rc1", False),
        ("0.19.0", "0.19.1", False),
        ("0.19", "0.19.0", True),
        ("0.19.0", "0.12.0", False),
        ("2.52.1", "2.52.10", False),
        ("13.2", "13.20.0", False),
        ("0.19.0", None, False),
        ("0.19.0+cu132", "0.19.0+cu132", True),  # a pin with a local label matches that exact build
        ("0.19.0+cu132", "0.19.0+cu130", False),
        ("13.2", "13.3.0", False),  # the numbers after the pin's length count only after the pin itself
        ("13.2", "13.2.", False),  # a dot with no release number after it
        ("0.19", "0.19..0", False),
        (" 13.2 ", "13.2.1\n", True),  # read from YAML and from a probe line
    ],
)
def test_version_matches(pin, found, ok):
    assert iv.version_matches(pin, found) is ok


def test_image_built_as_pinned_has_no_problems():
    assert iv.compare_versions(FOUND, PINS) == []


def test_unpinned_vllm_build_is_refused_naming_both_versions():
    found = {**FOUND, "vllm": "0.20.1.dev42+g1234abcd"}
    problems = iv.compare_versions(found, PINS)
    assert problems == ["vllm: the image carries 0.20.1.dev42+g1234abcd, the pin (sparkops_image_pins.vllm) is 0.19.0"]


def test_missing_component_is_a_problem():
    found = {**FOUND, "flashinfer": None}
    (problem,) = iv.compare_versions(found, PINS)
    assert problem.startswith("flashinfer: the image carries none, the pin")


def test_lock_is_compared_exactly_for_unpinned_components():
    locked = {"torch": "2.12.0.dev20260410+cu130", "nccl": "2.28.9"}
    assert iv.compare_versions(FOUND, PINS, locked) == []
    rebuilt = {**FOUND, "torch": "2.12.0.dev20260501+cu130"}
    assert iv.compare_versions(rebuilt, PINS, locked) == [
        "torch: the image carries 2.12.0.dev20260501+cu130, the lock file recorded 2.12.0.dev20260410+cu130"
    ]


def test_unknown_pin_component_is_reported():
    problems = iv.compare_versions(FOUND, {**PINS, "triton": "3.6.0"})
    assert problems and "triton" in problems[-1]


def test_parse_probe_output_takes_the_marker_line_among_noise():
    out = "WARNING something\n" + iv.MARKER + json.dumps(FOUND) + "\n"
    assert iv.parse_probe_output(out) == FOUND
    with pytest.raises(ValueError, match="no versions line"):
        iv.parse_probe_output("Traceback ...\n")
    with pytest.raises(ValueError, match="not JSON"):
        iv.parse_probe_output(iv.MARKER + "{broken\n")


def test_probe_runs_for_real_and_reads_installed_wheels(tmp_path):
    """The probe is run by a real python3 (here the test's own) and reports what importlib.metadata sees."""
    res = subprocess.run(
        [sys.executable, "-c", iv.PROBE], capture_output=True, text=True, check=True, env={"CUDA_VERSION": "13.2.0"}
    )
    found = iv.parse_probe_output(res.stdout)
    assert set(iv.COMPONENTS) <= set(found)
    assert found["cuda"] == "13.2.0"
    for comp, dist in (("ray", "ray"), ("torch", "torch"), ("vllm", "vllm")):
        try:
            expected = md.version(dist)
        except md.PackageNotFoundError:
            expected = None
        assert found[comp] == expected


@pytest.mark.parametrize(
    ("version", "file_commit", "commit"),
    [
        (EUGR_V0190, None, "2a69949bd"),
        (EUGR_PREBUILT, None, "a73af584f"),
        ("0.23.1rc1.dev197+g01192139b.d20260619", None, "01192139b"),  # eugr issue 296: no CUDA label
        ("0.20.1.dev42+g1a2b3c4d5", None, "1a2b3c4d5"),
        ("0.19.0", "g2a69949bd", "2a69949bd"),  # the official wheel: vllm/_version.py commit_id
        ("0.19.0+cu132", "2a69949bd", "2a69949bd"),
        (EUGR_V0190, "gffffffff0", "2a69949bd"),  # the version's label wins
        ("0.19.0", None, None),
        ("0.19.0+cu132", None, None),
        ("0.19.0", "not-a-commit", None),
        (None, None, None),
    ],
)
def test_vllm_commit_is_read_from_the_label_or_version_file(version, file_commit, commit):
    assert iv.vllm_commit(version, file_commit) == commit


def test_eugr_dirty_build_of_the_pinned_commit_is_accepted():
    assert iv.compare_versions({**FOUND, "vllm": EUGR_V0190}, COMMIT_PINS) == []
    # the same commit built another day, or with another CUDA, is the same commit
    assert iv.compare_versions({**FOUND, "vllm": "0.19.1.dev0+g2a69949bd.d20260501"}, COMMIT_PINS) == []
    # a full hash pin matches the 9-hex abbreviation
    full = {**COMMIT_PINS, "vllm_commit": "2a69949bd" + "0" * 31}
    assert iv.compare_versions({**FOUND, "vllm": EUGR_V0190}, full) == []


def test_version_only_pin_still_refuses_the_dirty_build():
    """Without the commit pin the old rule holds: the dev version is not the release (why the pin exists)."""
    (problem,) = iv.compare_versions({**FOUND, "vllm": EUGR_V0190}, PINS)
    assert problem == f"vllm: the image carries {EUGR_V0190}, the pin (sparkops_image_pins.vllm) is 0.19.0"


def test_another_commit_is_refused_naming_both_commits_and_versions():
    (problem,) = iv.compare_versions({**FOUND, "vllm": EUGR_PREBUILT}, COMMIT_PINS)
    assert problem == (
        f"vllm: the image carries {EUGR_PREBUILT} (commit a73af584f), the pin "
        "(sparkops_image_pins.vllm_commit, sparkops_image_pins.vllm) is 0.19.0 at commit 2a69949bd"
    )


def test_release_wheel_is_judged_by_its_version_file_commit():
    assert iv.compare_versions({**FOUND, "vllm": "0.19.0", "vllm_commit": "g2a69949bd"}, COMMIT_PINS) == []
    (problem,) = iv.compare_versions({**FOUND, "vllm": "0.19.0", "vllm_commit": "gdeadbeef1"}, COMMIT_PINS)
    assert "(commit deadbeef1)" in problem and "at commit 2a69949bd" in problem


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.19.0", True),  # setuptools-scm gives the bare tag only on a clean checkout of the tag's commit
        ("0.19.0+cu132", True),  # ... plus vLLM's CUDA label
        ("0.19.0.post1", False),
        ("0.19.1.dev0", False),  # a dev version without +g: which commit is unknown
        ("0.19", False),
        (None, False),
    ],
)
def test_build_without_a_readable_commit_must_be_exactly_the_release(version, ok):
    problems = iv.compare_versions({**FOUND, "vllm": version}, COMMIT_PINS)
    assert (problems == []) is ok
    if not ok:
        assert "commit unknown" in problems[0] and "0.19.0 at commit 2a69949bd" in problems[0]


def test_commit_pin_without_version_pin():
    pins = {**COMMIT_PINS, "vllm": None}
    assert iv.compare_versions({**FOUND, "vllm": EUGR_V0190}, pins) == []
    (problem,) = iv.compare_versions({**FOUND, "vllm": EUGR_PREBUILT}, pins)
    assert "(sparkops_image_pins.vllm_commit) is commit 2a69949bd" in problem


def test_same_commit_needs_seven_hex_and_a_prefix():
    assert iv.same_commit("2a69949bd", "2a69949")
    assert iv.same_commit("2a69949", "2a69949bd")
    assert iv.same_commit(" 2A69949BD", "2a69949\n")
    assert not iv.same_commit("2a6", "2a69949bd")  # too short on either side
    assert not iv.same_commit("2a6994", "2a69949bd")
    assert not iv.same_commit("2a69949bd", "2a6994")
    assert not iv.same_commit("2a69949bd", "2a6994")
    assert not iv.same_commit("2a69949bd", "2a69949be")


def test_lock_records_the_exact_dirty_string_and_the_commit():
    found = {**FOUND, "vllm": EUGR_V0190, "vllm_commit": "g2a69949bd", "flashinfer_cutlass": OWN_CUTLASS}
    record = iv.lock_record(found)
    assert record["vllm"] == EUGR_V0190
    assert record["vllm_commit"] == "2a69949bd"
    assert record["flashinfer_cutlass"] == OWN_CUTLASS
    assert set(record) == set(iv.LOCK_KEYS)
    # the same commit built again on another day differs only in setuptools-scm's build-date label: accepted
    rebuilt = {**found, "vllm": "0.19.1.dev0+g2a69949bd.d20260501.cu132"}
    assert iv.compare_versions(rebuilt, COMMIT_PINS, record) == []
    # anything else in the string is still compared exactly: another CUDA label, another dev number
    for other in ("0.19.1.dev0+g2a69949bd.d20260501.cu131", "0.19.1.dev1+g2a69949bd.d20260410.cu132"):
        assert iv.compare_versions({**found, "vllm": other}, COMMIT_PINS, record) == [
            f"vllm: the image carries {other}, the lock file recorded {EUGR_V0190}"
        ]


def test_lock_identity_drops_only_the_build_date_of_vllm():
    assert iv.lock_identity("vllm", EUGR_V0190) == "0.19.1.dev0+g2a69949bd.cu132"
    assert iv.lock_identity("vllm", "0.19.0+d20260410") == "0.19.0"
    assert iv.lock_identity("vllm", "0.19.0") == "0.19.0"
    # a date-like label elsewhere is the component's own: torch's nightly date is its version
    assert iv.lock_identity("torch", "2.12.0.dev20260410+cu130") == "2.12.0.dev20260410+cu130"
    assert iv.lock_identity("vllm", None) is None


def test_flashinfer_cutlass_other_than_the_locked_one_is_refused():
    # A FlashInfer whose own CUTLASS sparkops does not know (0.6.7): only the lock judges it.
    locked = {"flashinfer_cutlass": "4.2.1+sha256:1111111111111111"}
    found = {**FOUND, "flashinfer": "0.6.7", "flashinfer_cutlass": "4.3.0+sha256:2222222222222222"}
    assert iv.compare_versions(found, {**PINS, "flashinfer": None}, locked) == [
        "flashinfer_cutlass: the image carries 4.3.0+sha256:2222222222222222, the lock file recorded "
        "4.2.1+sha256:1111111111111111"
    ]


def test_every_mismatch_is_reported_at_once():
    """issue 30: after the first pin mismatch the later components must still be checked."""
    found = {**FOUND, "vllm": EUGR_PREBUILT, "flashinfer": "0.6.7", "ray": "2.50.0", "nccl": "2.29.7"}
    problems = iv.compare_versions(found, COMMIT_PINS, {"nccl": "2.28.9"})
    assert [p.split(":", 1)[0] for p in problems] == ["vllm", "flashinfer", "ray", "nccl"]


def test_a_component_refused_by_its_pin_is_not_named_again_for_the_lock():
    found = {**FOUND, "flashinfer": "0.6.7"}
    problems = iv.compare_versions(found, PINS, {"flashinfer": "0.6.6"})
    assert problems == ["flashinfer: the image carries 0.6.7, the pin (sparkops_image_pins.flashinfer) is 0.6.6"]


@pytest.mark.parametrize("line", ["null", "[]", '"0.19.0"', "42", '{"vllm": ["0.19.0"]}', '{"vllm": {"v": 1}}'])
def test_probe_line_that_is_not_a_flat_object_is_refused_not_crashing_later(line):
    """issue 30: a JSON null (or any non-object) probe line must be a clear error, not a TypeError later."""
    with pytest.raises(ValueError, match="probe's line"):
        iv.parse_probe_output(iv.MARKER + line + "\n")


def test_probe_reads_the_commit_and_cutlass_from_an_installed_tree(tmp_path):
    """The probe, run for real on a site-packages that holds a vLLM and a FlashInfer as their wheels install them."""
    site = tmp_path / "site"
    for name, version in (("vllm", "0.19.0"), ("flashinfer_python", "0.6.6")):
        info = site / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        dist_name = name.replace("_", "-")
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n")
    # vllm/_version.py as vcs-versioning writes it (the official 0.19.0 wheel's, /work/upstream)
    (site / "vllm").mkdir()
    (site / "vllm" / "_version.py").write_text(
        "__version__ = version = '0.19.0'\n__commit_id__ = commit_id = 'g2a69949bd'\n"
    )
    inc = site / "flashinfer" / "data" / "cutlass" / "include" / "cutlass"
    inc.mkdir(parents=True)
    (inc / "version.h").write_text("#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 1\n")
    (inc / "gemm.h").write_text("// one\n")

    def run():
        res = subprocess.run(
            [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); exec({iv.PROBE!r})"],
            capture_output=True,
            text=True,
            check=True,
        )
        return iv.parse_probe_output(res.stdout)

    first = run()
    assert first["vllm"] == "0.19.0" and first["vllm_commit"] == "2a69949bd"
    assert first["flashinfer_cutlass"].startswith("4.2.1+sha256:")
    # (its two-file CUTLASS is not FlashInfer 0.6.6's own: only the version components are looked at here)
    assert not [p for p in iv.compare_versions(first, COMMIT_PINS) if p.startswith(("vllm", "flashinfer:"))]
    (inc / "gemm.h").write_text("// two\n")  # another CUTLASS tree under the same version
    second = run()
    assert second["flashinfer_cutlass"].startswith("4.2.1+sha256:")
    assert second["flashinfer_cutlass"] != first["flashinfer_cutlass"]


def test_probe_reads_eugrs_build_metadata(tmp_path):
    """/workspace/build-metadata.yaml as build-and-copy.sh@fc08740:58-72 writes it (Dockerfile:346-347 copies it)."""
    meta = tmp_path / "build-metadata.yaml"
    meta.write_text(
        "build_date: 2026-04-10T12:00:00Z\nbuild_script_commit: fc08740fba1e79530a879c411b7e39fb65da2a18\n"
        "vllm_version: 0.19.1.dev0+g2a69949bd.d20260410.cu132\n"
        "vllm_commit: 2a69949bd0000000000000000000000000000000\n"
        "flashinfer_commit: 0123456789abcdef0123456789abcdef01234567\ngpu_arch: 12.1a\n"
    )
    res = subprocess.run(
        [sys.executable, "-I", "-c", iv.PROBE],
        capture_output=True,
        text=True,
        check=True,
        env={"SPARKOPS_BUILD_METADATA": str(meta)},
    )
    found = iv.parse_probe_output(res.stdout)
    assert found["flashinfer_commit"] == "0123456789abcdef0123456789abcdef01234567"
    if found["vllm"] is None:  # no vllm here: the metadata's commit is the only source
        assert found["vllm_commit"] == "2a69949bd0000000000000000000000000000000"
    assert iv.lock_record(found)["flashinfer_commit"] == "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("empty", [None, ""])
def test_an_empty_vllm_pin_beside_a_commit_pin_is_no_version_pin(empty):
    """`sparkops_image_pins: {vllm: "", vllm_commit: ...}`: YAML's empty string unpins like null does."""
    pins = {**COMMIT_PINS, "vllm": empty}
    (problem,) = iv.compare_versions({**FOUND, "vllm": EUGR_PREBUILT}, pins)
    assert problem == (
        f"vllm: the image carries {EUGR_PREBUILT} (commit a73af584f), the pin "
        "(sparkops_image_pins.vllm_commit) is commit 2a69949bd"
    )
    # Without a readable commit a build is accepted only as exactly the pinned release: with no release
    # pinned, nothing is accepted, not even a probe that read an empty version.
    for version in ("", "0.19.0", None):
        (problem,) = iv.compare_versions({**FOUND, "vllm": version}, pins)
        assert "commit unknown" in problem and problem.endswith("(sparkops_image_pins.vllm_commit) is commit 2a69949bd")


def test_no_pins_an_empty_commit_pin_and_a_pin_spelled_none():
    assert iv.compare_versions(FOUND, None, None) == []
    assert iv.compare_versions(FOUND, {**PINS, "vllm": ""}) == []  # YAML's '' unpins the version too
    # YAML's '' unpins the commit like null: the version pin alone judges a build that names its commit
    assert iv.compare_versions({**FOUND, "vllm": "0.19.0+g2a69949bd"}, {**PINS, "vllm_commit": ""}) == []
    # `vllm: None` in YAML is the string "None", not null: an image without vLLM is still refused
    (problem,) = iv.compare_versions({**FOUND, "vllm": None}, {"vllm": "None", "vllm_commit": "2a69949bd"})
    assert problem.startswith("vllm: the image carries none (commit unknown")


def test_eugrs_first_build_with_mains_cutlass_is_refused_not_locked():
    """issue 43: the first build (FlashInfer not in eugr's build cache) ships v0.6.6 with main's CUTLASS
    (Dockerfile@fc08740:97-103); with no lock yet it was accepted and then locked."""
    found = {**FOUND, "flashinfer_cutlass": MAIN_CUTLASS}
    problems = iv.compare_versions(found, COMMIT_PINS, {})
    assert len(problems) == 1 and problems[0].startswith("flashinfer_cutlass: "), problems
    assert MAIN_CUTLASS in problems[0] and OWN_CUTLASS in problems[0]
    assert "second build" in problems[0] and "Dockerfile@fc08740:97-103" in problems[0]
    # and the build that carries FlashInfer's own CUTLASS is accepted
    assert iv.compare_versions({**FOUND, "flashinfer_cutlass": OWN_CUTLASS}, COMMIT_PINS, {}) == []


def test_the_correct_build_is_not_refused_by_a_lock_that_recorded_the_first_builds_cutlass():
    """issue 43: a lock written after a first build holds main's CUTLASS; the next, correct build must pass."""
    locked = {"flashinfer": "0.6.6", "flashinfer_cutlass": MAIN_CUTLASS}
    assert iv.compare_versions({**FOUND, "flashinfer_cutlass": OWN_CUTLASS}, COMMIT_PINS, locked) == []
    # the wrong headers stay refused, whatever the lock says
    problems = iv.compare_versions({**FOUND, "flashinfer_cutlass": MAIN_CUTLASS}, COMMIT_PINS, locked)
    assert [p.split(":", 1)[0] for p in problems] == ["flashinfer_cutlass"]


def test_a_cutlass_pin_overrides_the_known_digest_and_is_compared_exactly():
    pins = {**COMMIT_PINS, "flashinfer_cutlass": "4.9.0+sha256:abcdefabcdefabcd"}
    assert iv.compare_versions({**FOUND, "flashinfer_cutlass": "4.9.0+sha256:abcdefabcdefabcd"}, pins) == []
    problems = iv.compare_versions({**FOUND, "flashinfer_cutlass": OWN_CUTLASS}, pins)
    assert problems and "sparkops_image_pins.flashinfer_cutlass" in problems[0]


def test_an_image_without_flashinfer_headers_or_of_an_unknown_flashinfer_is_not_judged_by_cutlass():
    # The simulated cluster's stand-in FlashInfer ships no headers (sim/standin/make_standin_dists.py).
    assert iv.cutlass_problem({**FOUND, "flashinfer_cutlass": None}) is None
    assert iv.cutlass_problem({**FOUND, "flashinfer": "0.6.7", "flashinfer_cutlass": MAIN_CUTLASS}) is None
    # a local label on the FlashInfer version does not hide the release
    assert iv.cutlass_problem({**FOUND, "flashinfer": "0.6.6+cu130", "flashinfer_cutlass": MAIN_CUTLASS})
