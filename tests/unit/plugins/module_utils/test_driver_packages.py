"""driver_packages.package_verdicts: the nvidia_driver role's decisions, as its Jinja made them before they
moved into gpu_facts (branch by version prefix, install when missing or off the pinned version)."""

from __future__ import annotations

from ansible_collections.sparkops.cluster.plugins.module_utils.driver_packages import package_verdicts

WANT = ["nvidia-driver-580-open", "nvidia-dkms-580-open"]


def pkg(version, selection="hold", installed=True):
    return {"version": version, "selection": selection, "installed": installed}


def test_everything_in_place_needs_nothing():
    found = {n: pkg("580.95.05-0ubuntu1") for n in WANT}
    v = package_verdicts(found, WANT, "580", "", {"gpu_present": True, "on_branch": True})
    assert v["installed"] == dict.fromkeys(WANT, "580.95.05-0ubuntu1")
    assert v["unheld"] == [] and v["packages_not_on_branch"] == []
    assert v["off_branch"] is False and v["install_needed"] is False
    # a pinned version the packages are not at is an install within the branch, not off the branch
    moved = package_verdicts(found, WANT, "580", "580.126.09-0ubuntu1", {})
    assert moved["install_needed"] is True and moved["off_branch"] is False
    assert package_verdicts(found, WANT, "580", "580.95.05-0ubuntu1", {})["install_needed"] is False


def test_a_package_or_the_loaded_driver_off_the_branch_is_off_branch():
    found = {WANT[0]: pkg("590.44.01-0ubuntu1", "install"), WANT[1]: pkg("580.95.05-0ubuntu1")}
    v = package_verdicts(found, WANT, "580", "", {})
    assert v["off_branch"] is True and v["packages_on_branch"] == [WANT[1]]
    assert v["unheld"] == [WANT[0]] and v["held"] == [WANT[1]]
    # "5800.1" is not on branch 580: the branch is the version's first field
    assert package_verdicts({WANT[0]: pkg("5800.1")}, WANT[:1], "580", "", {})["off_branch"] is True
    on = {n: pkg("580.95.05-0ubuntu1") for n in WANT}
    assert package_verdicts(on, WANT, "580", "", {"gpu_present": True, "on_branch": False})["off_branch"] is True
    # no GPU answered (simulated node, or query_gpu=false): only the packages count
    assert package_verdicts(on, WANT, "580", "", {"gpu_present": False, "on_branch": False})["off_branch"] is False


def test_missing_or_removed_packages_need_an_install():
    found = {WANT[0]: pkg("580.95.05-0ubuntu1"), WANT[1]: pkg("580.95.05-0ubuntu1", "deinstall", installed=False)}
    v = package_verdicts(found, WANT, "580", "", {})
    assert v["install_needed"] is True and v["installed"] == {WANT[0]: "580.95.05-0ubuntu1"}
    assert v["packages_not_on_branch"] == [WANT[1]] and v["off_branch"] is False
    assert package_verdicts({}, WANT, "580", "", {})["unheld"] == WANT
