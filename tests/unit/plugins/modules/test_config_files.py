"""config_files on a real folder: what it writes, what it leaves alone, check mode, validation, refusals."""

from __future__ import annotations

import os
import stat

from ansible_collections.sparkops.cluster.plugins.modules import config_files
from module_runner import run_module


def run(check_mode=False, diff=False, **args):
    if diff:
        args["_ansible_diff"] = True
    return run_module(config_files, args, check_mode=check_mode)


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_writes_missing_files_and_folders_then_changes_nothing(tmp_path):
    conf = tmp_path / "etc" / "app"
    files = [
        {"dest": str(conf / "a.conf"), "content": "a=1\n", "mode": "0644"},
        {"dest": str(conf / "run.sh"), "content": "#!/bin/sh\n", "mode": "0755"},
    ]
    dirs = [{"path": str(conf), "mode": "0750"}]
    res = run(files=files, directories=dirs)
    assert res["changed"] and not res.get("failed")
    assert res["changed_files"] == [f["dest"] for f in files]
    assert res["changed_directories"] == [str(conf)]
    assert (conf / "a.conf").read_text() == "a=1\n" and mode_of(conf / "a.conf") == 0o644
    assert mode_of(conf / "run.sh") == 0o755 and mode_of(conf) == 0o750

    again = run(files=files, directories=dirs)
    assert not again["changed"] and again["changed_files"] == [] and again["changed_directories"] == []
    assert {f["reason"] for f in again["files"]} == {"up to date"}


def test_rewrites_only_what_differs_content_or_mode(tmp_path):
    a, b, c = (tmp_path / n for n in ("a", "b", "c"))
    a.write_text("old\n")
    b.write_text("same\n")
    b.chmod(0o600)
    c.write_text("same\n")
    c.chmod(0o644)
    before_c = c.stat().st_mtime_ns
    files = [
        {"dest": str(a), "content": "new\n", "mode": "0644"},
        {"dest": str(b), "content": "same\n", "mode": "0644"},
        {"dest": str(c), "content": "same\n", "mode": "0644"},
    ]
    res = run(files=files, diff=True)
    assert res["changed_files"] == [str(a), str(b)]
    reasons = {f["dest"]: f["reason"] for f in res["files"]}
    assert reasons == {str(a): "content differs", str(b): "mode 0600 -> 0644", str(c): "up to date"}
    assert a.read_text() == "new\n" and mode_of(b) == 0o644
    assert c.stat().st_mtime_ns == before_c
    # The diff shows the content change only (b's bytes did not move).
    assert [(d["before"], d["after"]) for d in res["diff"]] == [("old\n", "new\n")]


def test_check_mode_reports_and_writes_nothing(tmp_path):
    target = tmp_path / "new" / "f.conf"
    res = run(
        check_mode=True,
        files=[{"dest": str(target), "content": "x\n", "mode": "0644"}],
        directories=[{"path": str(target.parent), "mode": "0755"}],
    )
    assert res["changed"] and res["changed_files"] == [str(target)]
    assert not target.parent.exists()


def test_a_failing_validation_replaces_nothing(tmp_path):
    conf = tmp_path / "p.yml"
    conf.write_text("good\n")
    res = run(files=[{"dest": str(conf), "content": "bad\n", "mode": "0644", "validate": "grep -q good %s"}])
    assert res["failed"] and "fails its check" in res["msg"] and "Nothing was replaced" in res["msg"]
    assert conf.read_text() == "good\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yml"]  # no temporary file left behind
    ok = run(files=[{"dest": str(conf), "content": "good too\n", "mode": "0644", "validate": "grep -q good %s"}])
    assert ok["changed"] and conf.read_text() == "good too\n"


def test_bad_entries_are_refused_together_and_nothing_is_written(tmp_path):
    good = tmp_path / "good.conf"
    res = run(
        files=[
            {"dest": str(good), "content": "x\n", "mode": "0644"},
            {"dest": "relative.conf", "content": "x\n", "mode": "0644"},
            {"dest": str(tmp_path / "nocontent"), "mode": "0644"},
            {"dest": str(good), "content": "y\n", "mode": "0644"},
        ]
    )
    assert res["failed"]
    for part in ("'relative.conf' is not absolute", "no content", f"files named twice: {good}", "Nothing was written"):
        assert part in res["msg"], res["msg"]
    assert not good.exists()


def test_an_unquoted_mode_is_refused_with_how_to_fix_it(tmp_path):
    # YAML reads 0644 unquoted as the integer 420, which Ansible hands over as "420".
    res = run(files=[{"dest": str(tmp_path / "f"), "content": "x", "mode": "420"}])
    assert res["failed"] and "not a four-digit octal string" in res["msg"] and '"0644"' in res["msg"]
    assert not (tmp_path / "f").exists()


def test_a_file_where_a_folder_should_be_is_refused(tmp_path):
    blocker = tmp_path / "etc"
    blocker.write_text("")
    res = run(directories=[{"path": str(blocker), "mode": "0755"}])
    assert res["failed"] and "is not a folder" in res["msg"]
