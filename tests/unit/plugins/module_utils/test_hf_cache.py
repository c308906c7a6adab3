"""hf_cache: manifests of a real on-disk hub cache, diffs, hashing, stream planning, node actions."""

from __future__ import annotations

import hashlib
import io
import json
import os

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import hf_cache
from hf_cache_helpers import MODEL, REVISION, make_model, write_listing


def test_repo_dir_refuses_unsafe_ids(tmp_path):
    assert hf_cache.repo_dir(str(tmp_path), "Qwen/Qwen3-235B-A22B-GPTQ-Int4").endswith(
        "models--Qwen--Qwen3-235B-A22B-GPTQ-Int4"
    )
    for bad in ("../etc", "a/../../b", "/abs/x", "a b/c", ""):
        with pytest.raises(ValueError, match="not a Hugging Face model id"):
            hf_cache.repo_dir(str(tmp_path), bad)


def test_manifest_resolves_ref_and_lists_referenced_blobs(tmp_path):
    model = make_model(tmp_path)
    # A blob of another revision must not be counted for this one.
    (model["repo"] / "blobs" / ("f" * 64)).write_bytes(b"other revision")
    m = hf_cache.build_manifest(str(model["repo"]), "main")
    assert m["present"] and m["revision_found"]
    assert m["revision"] == REVISION
    assert set(m["blobs"]) == set(model["names"].values())
    assert "f" * 64 not in m["blobs"]
    assert m["missing_blobs"] == []
    assert m["refs"] == {"main": REVISION}
    assert m["total_bytes"] == sum(m["blobs"].values())
    everything = hf_cache.build_manifest(str(model["repo"]))
    assert "f" * 64 in everything["blobs"]


def test_manifest_of_absent_model_and_unknown_revision(tmp_path):
    m = hf_cache.build_manifest(str(tmp_path / "models--x--y"), REVISION)
    assert not m["present"] and not m["revision_found"] and m["blobs"] == {}
    model = make_model(tmp_path)
    m = hf_cache.build_manifest(str(model["repo"]), "2" * 40)
    assert m["present"] and not m["revision_found"]
    m = hf_cache.build_manifest(str(model["repo"]), "no-such-branch")
    assert m["revision"] is None and not m["revision_found"]


def test_missing_blob_is_reported_and_an_incomplete_download_makes_it_incomplete(tmp_path):
    model = make_model(tmp_path)
    shard = model["names"]["model-00001-of-00003.safetensors"]
    blob = model["repo"] / "blobs" / shard
    blob.rename(blob.with_name(shard + ".incomplete"))
    m = hf_cache.build_manifest(str(model["repo"]), REVISION)
    assert m["missing_blobs"] == [shard]
    assert shard not in m["blobs"]
    assert m["incomplete_downloads"] == {shard: 256 * 1024}
    assert not m["complete"]


def test_complete_model_is_complete_by_each_source(tmp_path):
    model = make_model(tmp_path, index=True)
    m = hf_cache.build_manifest(str(model["repo"]), "main")
    assert m["complete"] and m["expected_from"] == "model index" and m["expected_files"] == 4
    write_listing(model["repo"])
    m = hf_cache.build_manifest(str(model["repo"]), "main")
    assert m["complete"] and m["expected_from"] == "hub listing" and m["expected_files"] == 5
    assert m["records"] == {
        f".sparkops/{REVISION}.json": (model["repo"] / ".sparkops" / f"{REVISION}.json").stat().st_size
    }


def test_shard_removed_with_its_link_and_a_partial_blob_is_incomplete(tmp_path):
    # Issue 16 item 2: blob and link of one shard gone, a <blob>.incomplete left by the download.
    model = make_model(tmp_path, index=True)
    repo, shard = model["repo"], "model-00002-of-00003.safetensors"
    name = model["names"][shard]
    for source in ("model index", "hub listing"):
        if source == "hub listing":
            write_listing(repo, **{shard: {"size": 256 * 1024, "blob_id": name, "lfs_sha256": name}})
        (repo / "snapshots" / REVISION / shard).unlink(missing_ok=True)
        (repo / "blobs" / name).unlink(missing_ok=True)
        (repo / "blobs" / (name + ".incomplete")).write_bytes(b"x" * 1000)
        m = hf_cache.build_manifest(str(repo), "main")
        assert m["missing_blobs"] == []  # no link points at it any more: the old check saw nothing
        assert not m["complete"], source
        assert m["expected_from"] == source
        assert m["missing_files"] == [shard]
        assert m["incomplete_downloads"] == {name: 1000}
        problems = " ".join(hf_cache.completeness_problems(m))
        assert f"1 of {m['expected_files']} files listed by the {source} are absent: {shard}" in problems
        assert "interrupted download" in problems


def test_listed_size_decides_and_the_hub_tree_cache_is_read(tmp_path):
    model = make_model(tmp_path)
    repo = model["repo"]
    shard = "model-00001-of-00003.safetensors"
    # huggingface_hub 1.x's own record (trees/<commit>.json, format_version 1) when ours is absent.
    (repo / "trees").mkdir()
    files = write_listing(repo)
    (repo / ".sparkops" / f"{REVISION}.json").unlink()
    files[shard] = dict(files[shard], size=999, lfs_size=999)
    (repo / "trees" / f"{REVISION}.json").write_text(json.dumps({"format_version": 1, "files": files}))
    m = hf_cache.build_manifest(str(repo), "main")
    assert m["expected_from"] == "hub tree cache"
    assert not m["complete"] and m["wrong_size_files"] == {shard: [999, 256 * 1024]}
    assert list(m["records"]) == [f"trees/{REVISION}.json"]  # travels with the model like ours
    # A listed file absent from the snapshot altogether.
    files = write_listing(repo, **{"extra/tokenizer.json": {"size": 10, "blob_id": "a" * 40}})
    m = hf_cache.build_manifest(str(repo), "main")
    assert m["expected_from"] == "hub listing" and m["missing_files"] == ["extra/tokenizer.json"]


def test_hash_record_sees_a_same_size_change_without_reading(tmp_path):
    model = make_model(tmp_path)
    repo = str(model["repo"])
    names = list(model["names"].values())
    assert hf_cache.verify_and_record(repo, names) == []
    status = hf_cache.hash_record_status(repo, names)
    assert sorted(status["unchanged"]) == sorted(names) and not status["changed_since_hashed"]
    shard = model["names"]["model-00003-of-00003.safetensors"]
    path = model["repo"] / "blobs" / shard
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    st = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a write moves mtime; make sure here
    assert hf_cache.hash_record_status(repo, names)["changed_since_hashed"] == [shard]
    assert hf_cache.verify_and_record(repo, names) == [shard]
    # The bad blob is not recorded as good.
    assert hf_cache.hash_record_status(repo, names)["changed_since_hashed"] == [shard]


def test_diff_copies_the_recorded_listing(tmp_path):
    model = make_model(tmp_path / "a")
    write_listing(model["repo"])
    src = hf_cache.build_manifest(str(model["repo"]), REVISION)
    dst = hf_cache.build_manifest(str(tmp_path / "b" / "models--x--y"), REVISION)
    diff = hf_cache.diff_manifests(src, dst)
    assert f".sparkops/{REVISION}.json" in diff["copy"]


def test_diff_lists_only_what_the_target_lacks(tmp_path):
    src = make_model(tmp_path / "src")
    dst = make_model(tmp_path / "dst")
    names = src["names"]
    # Target: one shard missing, one truncated (an interrupted copy), link of config missing.
    (dst["repo"] / "blobs" / names["model-00002-of-00003.safetensors"]).unlink()
    trunc = dst["repo"] / "blobs" / names["model-00003-of-00003.safetensors"]
    trunc.write_bytes(trunc.read_bytes()[:1000])
    (dst["repo"] / "snapshots" / REVISION / "config.json").unlink()
    (dst["repo"] / "refs" / "main").unlink()
    a = hf_cache.build_manifest(str(src["repo"]), REVISION)
    # The target is read with all its blobs: one no snapshot links to yet is not copied again.
    b = hf_cache.build_manifest(str(dst["repo"]), REVISION, all_blobs=True)
    d = hf_cache.diff_manifests(a, b)
    assert d["missing"] == [names["model-00002-of-00003.safetensors"]]
    assert d["mismatched"] == [names["model-00003-of-00003.safetensors"]]
    assert set(d["copy"]) == {f"blobs/{d['missing'][0]}", f"blobs/{d['mismatched'][0]}"}
    assert d["bytes_to_copy"] == 2 * 256 * 1024
    assert d["bytes_needed"] == 256 * 1024 + (256 * 1024 - 1000)
    assert list(d["links_create"]) == [f"snapshots/{REVISION}/config.json"]
    assert d["refs_update"] == {"main": REVISION}
    assert not d["in_sync"]
    same = hf_cache.diff_manifests(a, a)
    assert same["in_sync"] and same["copy"] == {} and same["bytes_needed"] == 0


def test_verify_blob_sha256_and_git_sha1(tmp_path):
    model = make_model(tmp_path)
    blobs = model["repo"] / "blobs"
    for name in model["names"].values():
        assert hf_cache.verify_blob(str(blobs / name), name)
    shard = model["names"]["model-00001-of-00003.safetensors"]
    data = bytearray((blobs / shard).read_bytes())
    data[100] ^= 0xFF  # same size, one flipped byte
    (blobs / shard).write_bytes(bytes(data))
    assert not hf_cache.verify_blob(str(blobs / shard), shard)
    assert hf_cache.failing_blobs(str(blobs), list(model["names"].values())) == [shard]
    with pytest.raises(ValueError, match="cannot be verified"):
        hf_cache.verify_blob(str(blobs / shard), "not-a-hash")


def test_plan_streams_balances_bytes():
    sizes = {"a": 100, "b": 90, "c": 50, "d": 40, "e": 10}
    lists = hf_cache.plan_streams(sizes, 2)
    loads = sorted(sum(sizes[n] for n in lst) for lst in lists)
    assert loads == [140, 150]
    assert sorted(n for lst in lists for n in lst) == sorted(sizes)
    assert hf_cache.plan_streams(sizes, 10) == [[n] for n in ("a", "b", "c", "d", "e")]
    assert hf_cache.plan_streams({}, 4) == []


def test_node_links_writes_relative_links_and_refuses_escapes(tmp_path):
    repo = tmp_path / f"models--{MODEL.replace('/', '--')}"
    hf_cache.node_mkdirs({"repo": str(repo)})
    done = hf_cache.node_links(
        {
            "repo": str(repo),
            "links": {f"snapshots/{REVISION}/a.json": "../../blobs/" + "a" * 40},
            "refs": {"main": REVISION},
        }
    )
    assert done == {"links_created": 1, "links_fixed": 0, "refs_written": 1}
    assert os.readlink(repo / "snapshots" / REVISION / "a.json") == "../../blobs/" + "a" * 40
    again = hf_cache.node_links(
        {"repo": str(repo), "links": {f"snapshots/{REVISION}/a.json": "../../blobs/" + "a" * 40}}
    )
    assert again["links_created"] == 0 and again["links_fixed"] == 0
    with pytest.raises(ValueError, match="leaves the model"):
        hf_cache.node_links({"repo": str(repo), "links": {f"snapshots/{REVISION}/x": "../../../../etc/passwd"}})
    with pytest.raises(ValueError, match="refusing snapshot path"):
        hf_cache.node_links({"repo": str(repo), "links": {"../outside": "blobs/x"}})
    with pytest.raises(ValueError, match="refusing ref"):
        hf_cache.node_links({"repo": str(repo), "refs": {"main": "not-a-sha"}})


def test_node_mkdirs_removes_only_rsync_leftovers(tmp_path):
    repo = tmp_path / "models--a--b"
    (repo / "blobs").mkdir(parents=True)
    leftover = repo / "blobs" / ("." + "a" * 64 + ".Xy12Zq")
    keep = repo / "blobs" / ("b" * 64)
    leftover.write_bytes(b"partial")
    keep.write_bytes(b"whole")
    res = hf_cache.node_mkdirs({"repo": str(repo)})
    assert res["stale_temp_removed"] == [leftover.name]
    assert not leftover.exists() and keep.exists()


def test_remote_main_reports_errors_as_a_result_line():
    out = io.StringIO()
    rc = hf_cache.remote_main(io.BytesIO(b'{"action": "links", "repo": "/tmp/x", "refs": {"../a": "1"}}\n'), out)
    assert rc == 3
    line = out.getvalue().strip()
    assert line.startswith(hf_cache.RESULT_MARK)
    assert "refusing ref" in json.loads(line[len(hf_cache.RESULT_MARK) :])["error"]


def test_remote_main_serves_several_actions_in_one_session(tmp_path):
    # One channel carries every step on a node; a failed step answers with an error and the
    # session goes on (the source decides), and rsyncd_stop without a daemon is harmless.
    repo = tmp_path / "models--org--m"
    lines = [
        {"action": "mkdirs", "repo": str(repo)},
        {"action": "links", "repo": str(repo), "refs": {"../a": "1"}},
        {"action": "links", "repo": str(repo), "refs": {"main": "a" * 40}},
        {"action": "rsyncd_stop"},
    ]
    out = io.StringIO()
    rc = hf_cache.remote_main(io.BytesIO(b"".join(json.dumps(x).encode() + b"\n" for x in lines)), out)
    results = [json.loads(line[len(hf_cache.RESULT_MARK) :]) for line in out.getvalue().splitlines()]
    assert rc == 3
    assert len(results) == 4
    assert results[0]["repo"] == str(repo) and (repo / "blobs").is_dir()
    assert "refusing ref" in results[1]["error"]
    assert results[2]["refs_written"] == 1 and (repo / "refs" / "main").read_text() == "a" * 40
    assert results[3] == {"stopped": False}


# --- links and files a sync creates stay inside the target's cache (issue 23) ----------------------

BLOB = "b" * 64


def _target(tmp_path):
    repo = tmp_path / "cache" / f"models--{MODEL.replace('/', '--')}"
    hf_cache.node_mkdirs({"repo": str(repo)})
    return repo


def _links(repo, links=None, refs=None):
    return hf_cache.node_links({"repo": str(repo), "links": links or {}, "refs": refs or {}})


def test_the_three_sync_attack_of_a_crafted_snapshot_is_refused_at_its_first_step(tmp_path):
    # The audit's attack: sync 1 plants snapshots/R/d -> ../.. (the model's folder, "inside" as text);
    # sync 2 sends snapshots/R/d/x -> ../../.. which, created through d, lands as <repo>/x pointing out of
    # the cache; sync 3 writes snapshots/R/d/x/<victim>/cron.d/evil through both. Each step alone was
    # accepted by the text check.
    repo = _target(tmp_path)
    victim = tmp_path / "victim" / "cron.d"
    victim.mkdir(parents=True)
    steps = [
        {f"snapshots/{REVISION}/d": "../.."},
        {f"snapshots/{REVISION}/d/x": "../../.."},
        {f"snapshots/{REVISION}/d/x/victim/cron.d/evil": "../../../../../../blobs/" + BLOB},
    ]
    for links in steps[:2]:
        with pytest.raises(ValueError, match="refusing link"):
            _links(repo, links)
    # The third is a well-formed deep snapshot link: it is created in real folders inside the snapshot.
    assert _links(repo, steps[2])["links_created"] == 1
    assert (repo / "snapshots" / REVISION / "d" / "x" / "victim" / "cron.d").is_dir()
    assert not (repo / "snapshots" / REVISION / "d").is_symlink()
    assert not os.path.lexists(repo / "x")
    assert list(victim.iterdir()) == []


def test_links_already_on_disk_are_never_followed(tmp_path):
    # Even with the first two steps in place (planted by hand, as the old code let a sync do, or by a
    # local user who can write into the cache), nothing is created through them.
    repo = _target(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    snap = repo / "snapshots" / REVISION
    snap.mkdir(parents=True)
    (snap / "d").symlink_to(outside)
    with pytest.raises(ValueError, match="is a link or not a folder"):
        _links(repo, {f"snapshots/{REVISION}/d/evil": "../../../blobs/" + BLOB})
    (repo / "refs").rmdir()
    (repo / "refs").symlink_to(outside)
    with pytest.raises(ValueError, match="is a link or not a folder"):
        _links(repo, refs={"main": REVISION})
    (repo / "snapshots").rename(repo / "snapshots.real")
    (repo / "snapshots").symlink_to(outside)
    with pytest.raises(ValueError, match="is a link or not a folder"):
        _links(repo, {f"snapshots/{REVISION}/a.json": "../../blobs/" + BLOB})
    assert list(outside.iterdir()) == []


def test_the_model_folder_itself_behind_a_link_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "cache").mkdir()
    repo = tmp_path / "cache" / f"models--{MODEL.replace('/', '--')}"
    repo.symlink_to(outside)
    with pytest.raises(ValueError, match="is a link or not a folder"):
        hf_cache.node_mkdirs({"repo": str(repo)})
    with pytest.raises(ValueError, match="is a link or not a folder"):
        _links(repo, refs={"main": REVISION})
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize(
    ("rel", "target"),
    [
        # issue 30 (:572): a "link" outside snapshots/ written over a blob
        (f"blobs/{BLOB}", "../blobs/" + "c" * 64),
        (f"refs/{BLOB}", "../blobs/" + BLOB),
        (f"snapshots/{REVISION}", "../blobs/" + BLOB),
        # targets that stay inside as text but are not a blob of this model
        (f"snapshots/{REVISION}/a", "../../refs/main"),
        (f"snapshots/{REVISION}/a", "../../snapshots/" + REVISION),
        (f"snapshots/{REVISION}/a", "../../blobs/not-a-hash"),
        (f"snapshots/{REVISION}/a", "../../blobs/" + BLOB + "/x"),
        (f"snapshots/{REVISION}/sub/a", "../../blobs/" + BLOB),  # resolves to snapshots/blobs/...
        (f"snapshots/{REVISION}/a", "../../../models--other--m/blobs/" + BLOB),
        (f"snapshots/{REVISION}/a", "/abs/blobs/" + BLOB),
        (f"snapshots/{REVISION}/a", "./../../blobs/" + BLOB),
    ],
)
def test_only_snapshot_links_to_a_blob_of_the_same_model_are_accepted(tmp_path, rel, target):
    repo = _target(tmp_path)
    before = sorted(str(p) for p in repo.rglob("*"))
    with pytest.raises(ValueError, match="refusing"):
        _links(repo, {rel: target, f"snapshots/{REVISION}/ok.json": "../../blobs/" + BLOB})
    assert sorted(str(p) for p in repo.rglob("*")) == before, "a refused set of links wrote something"


def test_links_in_snapshot_subfolders_and_a_fixed_link(tmp_path):
    repo = _target(tmp_path)
    rel = f"snapshots/{REVISION}/original/consolidated.safetensors"
    assert _links(repo, {rel: "../../../blobs/" + BLOB})["links_created"] == 1
    assert os.readlink(repo / rel) == "../../../blobs/" + BLOB
    other = "c" * 64
    assert _links(repo, {rel: "../../../blobs/" + other})["links_fixed"] == 1
    assert os.readlink(repo / rel) == "../../../blobs/" + other
    # A folder where the link goes is refused, not replaced or filled.
    (repo / "snapshots" / REVISION / "dir.json").mkdir()
    with pytest.raises(ValueError, match="refusing to replace the folder"):
        _links(repo, {f"snapshots/{REVISION}/dir.json": "../../blobs/" + BLOB})
    assert [p.name for p in (repo / "snapshots" / REVISION).iterdir() if ".sparkops-tmp" in p.name] == []


def test_the_hash_record_is_never_written_through_a_link(tmp_path):
    model = make_model(tmp_path)
    repo = model["repo"]
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / ".sparkops").symlink_to(outside)
    with pytest.raises(ValueError, match="is a link or not a folder"):
        hf_cache.save_hash_record(str(repo), list(model["names"].values()))
    assert list(outside.iterdir()) == []
    (repo / ".sparkops").unlink()
    (repo / ".sparkops").mkdir()
    (repo / ".sparkops" / "hashed-blobs.json").symlink_to(outside / "record")
    hf_cache.save_hash_record(str(repo), list(model["names"].values()))
    assert not (repo / ".sparkops" / "hashed-blobs.json").is_symlink()  # replaced, not written through
    assert list(outside.iterdir()) == []


# --- issue 30: hf_cache survivors ----------------------------------------------------------------


def test_files_in_snapshot_subfolders_are_in_the_manifest_and_count_for_completeness(tmp_path):
    # gpt-oss ships original/: its files must be listed, copied and required like the others.
    model = make_model(tmp_path)
    repo = model["repo"]
    data = b"original weights" * 100
    name = hashlib.sha256(data).hexdigest()
    (repo / "blobs" / name).write_bytes(data)
    sub = repo / "snapshots" / REVISION / "original"
    sub.mkdir()
    (sub / "model.safetensors").symlink_to("../../../blobs/" + name)
    (sub / "params.json").write_bytes(b"{}")  # a plain file in a subfolder
    m = hf_cache.build_manifest(str(repo), "main")
    assert m["links"][f"snapshots/{REVISION}/original/model.safetensors"] == "../../../blobs/" + name
    assert m["files"] == {f"snapshots/{REVISION}/original/params.json": 2}
    assert m["blobs"][name] == len(data)
    write_listing(repo)
    assert hf_cache.build_manifest(str(repo), "main")["complete"]
    (repo / "blobs" / name).unlink()
    m = hf_cache.build_manifest(str(repo), "main")
    assert not m["complete"] and m["missing_blobs"] == [name]
    assert m["missing_files"] == ["original/model.safetensors"]


def test_full_verify_on_a_target_finds_a_same_size_corrupt_blob_and_check_mode_writes_no_record(tmp_path):
    model = make_model(tmp_path)
    repo = model["repo"]
    names = model["names"]
    bad = names["model-00002-of-00003.safetensors"]
    path = repo / "blobs" / bad
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    want = {n: (repo / "blobs" / n).stat().st_size for n in names.values()}
    # Check mode (record=False): the hash is checked, nothing is written.
    res = hf_cache.node_manifest({"repo": str(repo), "revision": "main", "hash": want, "record": False})
    assert res["hash_failed"] == [bad]
    assert not (repo / ".sparkops").exists(), "check mode wrote the hash record"
    res = hf_cache.node_manifest({"repo": str(repo), "revision": "main", "hash": want})
    assert res["hash_failed"] == [bad]
    record = json.loads((repo / ".sparkops" / "hashed-blobs.json").read_text())["blobs"]
    assert set(record) == set(names.values()) - {bad}
    # A blob whose size already differs from the source's is not hashed (its size fails it anyway).
    res = hf_cache.node_manifest({"repo": str(repo), "revision": "main", "hash": {bad: want[bad] + 1}})
    assert res["hash_failed"] == []


def test_nearest_existing_and_free_bytes(tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    assert hf_cache.nearest_existing(str(deep)) == str(tmp_path)
    (tmp_path / "a").mkdir()
    assert hf_cache.nearest_existing(str(deep)) == str(tmp_path / "a")
    assert hf_cache.nearest_existing(str(tmp_path)) == str(tmp_path)
    assert hf_cache.nearest_existing("/") == "/"
    st = os.statvfs(tmp_path)
    got = hf_cache.free_bytes(str(deep))
    # f_bavail (what a user may fill), not f_bfree (which counts root's reserve), times f_frsize.
    assert abs(got - st.f_bavail * st.f_frsize) < 64 * 1024 * 1024
    assert got % st.f_frsize == 0
    res = hf_cache.node_free({"repo": str(deep)})
    assert res["free_path"] == str(tmp_path / "a") and res["free_bytes"] > 0


def test_a_snapshot_folder_that_is_a_link_is_not_walked(tmp_path):
    # A crafted source: snapshots/<rev> -> / would list (and a sync would send) the whole filesystem.
    model = make_model(tmp_path)
    repo = model["repo"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret").write_bytes(b"not a model file")
    other = "2" * 40
    (repo / "snapshots" / other).symlink_to(elsewhere)
    m = hf_cache.build_manifest(str(repo), other)
    assert not m["revision_found"] and m["files"] == {} and m["links"] == {}
    everything = hf_cache.build_manifest(str(repo))
    assert not any(other in rel for rel in everything["files"]) and everything["revision_found"]
    (repo / "snapshots" / REVISION).rename(repo / "real-snapshot")
    (repo / "snapshots" / REVISION).symlink_to(repo / "real-snapshot")
    assert not hf_cache.build_manifest(str(repo), "main")["revision_found"]


def test_an_interrupted_lfs_shard_counts_by_its_sha256_not_the_pointers_git_id(tmp_path):
    # The Hub lists an LFS file with blob_id = the git id of its pointer and lfs.sha256 = the blob's
    # name; the partial download is <sha256>.incomplete and must count as this revision's.
    model = make_model(tmp_path)
    repo, shard = model["repo"], "model-00002-of-00003.safetensors"
    name = model["names"][shard]
    write_listing(repo, **{shard: {"size": 256 * 1024, "blob_id": "e" * 40, "lfs_sha256": name}})
    (repo / "snapshots" / REVISION / shard).unlink()
    (repo / "blobs" / name).rename(repo / "blobs" / (name + ".incomplete"))
    (repo / "blobs" / ("f" * 64 + ".incomplete")).write_bytes(b"another revision's")
    m = hf_cache.build_manifest(str(repo), "main")
    assert m["incomplete_downloads"] == {name: 256 * 1024}


def test_partial_downloads_and_links_in_blobs_are_not_blobs(tmp_path):
    model = make_model(tmp_path)
    repo = model["repo"]
    (repo / "blobs" / ("a" * 64 + ".incomplete")).write_bytes(b"partial")
    (repo / "blobs" / ("b" * 64)).symlink_to("/etc/hostname")
    m = hf_cache.build_manifest(str(repo), "main", all_blobs=True)
    assert set(m["blobs"]) == set(model["names"].values())


def test_a_plain_file_where_the_source_has_a_link_is_fixed(tmp_path):
    src = make_model(tmp_path / "src")
    dst = make_model(tmp_path / "dst")
    link = dst["repo"] / "snapshots" / REVISION / "config.json"
    data = link.read_bytes()
    link.unlink()
    link.write_bytes(data)  # a copy instead of the link (huggingface_hub without symlink support)
    d = hf_cache.diff_manifests(
        hf_cache.build_manifest(str(src["repo"]), REVISION), hf_cache.build_manifest(str(dst["repo"]), REVISION)
    )
    assert list(d["links_fix"]) == [f"snapshots/{REVISION}/config.json"] and d["links_create"] == {}
    assert not d["in_sync"]


def test_an_absent_model_still_names_a_commit_revision_and_only_blob_links_count(tmp_path):
    absent = str(tmp_path / "models--x--y")
    assert hf_cache.build_manifest(absent, REVISION)["revision"] == REVISION
    assert hf_cache.build_manifest(absent, "main")["revision"] is None
    assert hf_cache.build_manifest(absent)["revision"] is None
    rel = f"snapshots/{REVISION}/a"
    assert hf_cache._blob_of(rel, "../../blobs/" + "a" * 64) == "a" * 64
    for target in ("../../refs/main", "../../blobs/..", "../../blobs/.", "../../snapshots/x", "/abs/blobs/x"):
        assert hf_cache._blob_of(rel, target) is None, target


# --- issue 30: what a mutation run found unpinned ----------------------------------------------------


@pytest.mark.parametrize("bad", ["org/..", "a/b/c", "org/name\n", "gpt2\n", 7, None])
def test_repo_dir_refuses_a_dot_dot_name_and_other_non_ids(tmp_path, bad):
    """'org/..' matches the id's character classes; as a folder it would name the cache's parent."""
    with pytest.raises(ValueError, match="not a Hugging Face model id"):
        hf_cache.repo_dir(str(tmp_path), bad)
    assert hf_cache.repo_dir(str(tmp_path), "gpt2") == os.path.join(str(tmp_path), "models--gpt2")
    assert hf_cache.repo_dir("/c", "org/..x").endswith("models--org--..x")  # dots inside a name are a name


def test_an_absent_model_has_an_empty_manifest(tmp_path):
    m = hf_cache.build_manifest(str(tmp_path / "models--x--y"), REVISION)
    assert m == {
        "repo": "models--x--y",
        "present": False,
        "revision": REVISION,
        "revision_found": False,
        "refs": {},
        "links": {},
        "files": {},
        "blobs": {},
        "missing_blobs": [],
        "total_bytes": 0,
        "expected_from": None,
        "expected_files": 0,
        "missing_files": [],
        "wrong_size_files": {},
        "incomplete_downloads": {},
        "records": {},
        "complete": False,
    }


def test_referenced_blobs_are_the_snapshot_links_targets(tmp_path):
    model = make_model(tmp_path)
    m = hf_cache.build_manifest(str(model["repo"]), REVISION)
    assert hf_cache.referenced_blobs(m) == set(model["names"].values())
    assert hf_cache.referenced_blobs({}) == set()


def test_diff_fixes_a_link_with_another_target_and_needs_no_space_for_a_longer_target_blob():
    src = {
        "blobs": {"a" * 64: 100},
        "files": {},
        "links": {"snapshots/r/x": "../../blobs/" + "a" * 64, "snapshots/r/y": "../../blobs/" + "a" * 64},
        "refs": {},
    }
    dst = {
        "blobs": {"a" * 64: 150},  # longer than the source's: rsync --inplace truncates it
        "files": {},
        "links": {"snapshots/r/x": "../../blobs/" + "b" * 64, "snapshots/r/y": "../../blobs/" + "a" * 64},
        "refs": {},
    }
    d = hf_cache.diff_manifests(src, dst)
    assert d["links_fix"] == {"snapshots/r/x": "../../blobs/" + "a" * 64}
    assert d["links_create"] == {}
    assert d["mismatched"] == ["a" * 64]
    assert (d["bytes_to_copy"], d["bytes_needed"]) == (100, 0)
    files = hf_cache.diff_manifests({"files": {"f": 10}}, {"files": {"f": 30}})
    assert (files["files_mismatched"], files["bytes_needed"]) == (["f"], 0)


def test_hashing_works_where_the_cpu_count_is_unknown(tmp_path, monkeypatch):
    """os.cpu_count() may return None (a container that hides it): one worker then."""
    model = make_model(tmp_path)
    monkeypatch.setattr(hf_cache.os, "cpu_count", lambda: None)
    blobs = model["repo"] / "blobs"
    assert hf_cache.failing_blobs(str(blobs), list(model["names"].values())) == []


def test_a_name_with_a_final_newline_is_no_hash_commit_or_ref(tmp_path):
    """Python's "$" matches before a final newline: these names become file names and link targets."""
    sha, sha1 = "a" * 64, "b" * 40
    assert hf_cache.hash_kind(sha) == "sha256" and hf_cache.hash_kind(sha1) == "git-sha1"
    assert hf_cache.hash_kind(sha + "\n") is None and hf_cache.hash_kind(sha1 + "\n") is None
    assert not hf_cache.receivable_path(f"blobs/{sha}\n")
    assert not hf_cache.link_target_ok(f"snapshots/{sha1}/config.json", f"../../blobs/{sha}\n")
    assert hf_cache.build_manifest(str(tmp_path / "models--x--y"), sha1 + "\n")["revision"] is None
    repo = tmp_path / "models--org--name"
    for name, value in (("main\n", sha1), ("main", sha1 + "\n")):
        with pytest.raises(ValueError, match="refusing ref"):
            hf_cache.node_links({"repo": str(repo), "refs": {name: value}})
    assert not (repo / "refs").exists() or list((repo / "refs").iterdir()) == []
    (repo / "blobs").mkdir(parents=True)
    leftover = repo / "blobs" / f".{sha}.Ab12Cd\n"  # not what a killed rsync leaves: kept
    leftover.write_bytes(b"x")
    assert hf_cache.node_mkdirs({"repo": str(repo)})["stale_temp_removed"] == []
    assert leftover.exists()


@pytest.mark.parametrize(
    "rel",
    [
        f"snapshots//{REVISION}/a",
        f"snapshots/{REVISION}/",
        f"snapshots/{REVISION}/./a",
        f"snapshots/{REVISION}/../a",
        f"snapshots/{REVISION}/a/..",
        f"snapshots/{REVISION}/.",
        f"./snapshots/{REVISION}/a",
        f"/snapshots/{REVISION}/a",
        f"../snapshots/{REVISION}/a",
    ],
)
def test_a_snapshot_path_with_an_empty_dot_or_dot_dot_part_has_no_link_target(rel):
    assert hf_cache.canonical_link_target(rel) is None
    assert not hf_cache.receivable_path(rel)
    assert hf_cache.canonical_link_target(f"snapshots/{REVISION}/original/a") == "../../../blobs/"


@pytest.mark.parametrize(
    ("target", "blob"),
    [
        ("../../blobs/" + "a" * 64, "a" * 64),
        ("../../blobs/./" + "a" * 64, "a" * 64),
        ("../../blobs/", None),
        ("../../blobs/.", None),
        ("../../blobs/..", None),
        ("../../blobs/x/..", None),
        ("../../blobs", None),
        ("/repo/blobs/" + "a" * 64, None),
        ("../../../blobs/" + "a" * 64, None),
    ],
)
def test_the_blob_a_snapshot_link_names(target, blob):
    assert hf_cache.referenced_blobs({"links": {f"snapshots/{REVISION}/a": target}}) == ({blob} if blob else set())


def test_an_absent_commit_is_never_complete(tmp_path):
    model = make_model(tmp_path)
    write_listing(model["repo"], "2" * 40)  # a listing of a commit whose snapshot is not here
    m = hf_cache.build_manifest(str(model["repo"]), "2" * 40)
    assert (m["revision"], m["revision_found"], m["complete"], m["expected_from"]) == ("2" * 40, False, False, None)
    assert hf_cache.completeness_problems(m) == ["the revision's snapshot is absent"]


def test_a_stray_partial_download_keeps_a_model_without_a_listing_incomplete(tmp_path):
    model = make_model(tmp_path)
    assert hf_cache.build_manifest(str(model["repo"]), REVISION)["complete"]
    (model["repo"] / "blobs" / ("e" * 64 + ".incomplete")).write_bytes(b"x" * 10)
    m = hf_cache.build_manifest(str(model["repo"]), REVISION)
    assert (m["complete"], m["incomplete_downloads"]) == (False, {"e" * 64: 10})
    why = f"1 interrupted download(s) (blobs/*.incomplete): {'e' * 12}... at 10 bytes"
    assert hf_cache.completeness_problems(m) == [why]


def test_a_listing_that_is_a_link_is_no_record(tmp_path):
    model = make_model(tmp_path)
    write_listing(model["repo"])
    rec = model["repo"] / ".sparkops" / f"{REVISION}.json"
    assert set(hf_cache.build_manifest(str(model["repo"]), REVISION)["records"]) == {f".sparkops/{REVISION}.json"}
    elsewhere = tmp_path / "listing.json"
    rec.rename(elsewhere)
    rec.symlink_to(elsewhere)
    assert hf_cache.build_manifest(str(model["repo"]), REVISION)["records"] == {}


def test_the_hash_record_says_when_each_blob_was_hashed(tmp_path):
    model = make_model(tmp_path)
    name = model["names"]["config.json"]
    hf_cache.save_hash_record(str(model["repo"]), ["0" * 64, name])  # an absent blob is not recorded
    text = (model["repo"] / ".sparkops" / "hashed-blobs.json").read_text()
    assert f'\n "blobs": {{\n  "{name}": {{\n   "size": ' in text  # one line a field, for a person reading it
    data = json.loads(text)
    assert data["format"] == "sparkops-hashed-blobs/1" and list(data["blobs"]) == [name]
    st = (model["repo"] / "blobs" / name).stat()
    rec = data["blobs"][name]
    assert (rec["size"], rec["mtime_ns"]) == (st.st_size, st.st_mtime_ns)
    assert rec["hashed_at"].endswith("Z") and len(rec["hashed_at"]) == len("2026-11-25T04:00:00Z")


def test_diff_names_extra_blobs_and_files_missing_or_mismatched():
    src = {"blobs": {"a" * 64: 5}, "files": {"s/r/x": 3, "s/r/y": 4}}
    dst = {"blobs": {"a" * 64: 5, "b" * 64: 7}, "files": {"s/r/y": 9}}
    d = hf_cache.diff_manifests(src, dst)
    assert d["extra"] == ["b" * 64] and d["missing"] == [] and d["mismatched"] == []
    assert (d["files_missing"], d["files_mismatched"]) == (["s/r/x"], ["s/r/y"])
    assert d["copy"] == {"s/r/x": 3, "s/r/y": 4} and d["bytes_needed"] == 3
    assert set(d) == {
        "missing", "mismatched", "extra", "files_missing", "files_mismatched", "links_create", "links_fix",
        "refs_update", "copy", "bytes_to_copy", "bytes_needed", "in_sync",
    }  # fmt: skip


def test_hashing_uses_a_few_threads_never_more_than_blobs(tmp_path, monkeypatch):
    model = make_model(tmp_path)
    names = list(model["names"].values())
    seen = []
    real = hf_cache.ThreadPoolExecutor

    def recording(max_workers):
        seen.append(max_workers)
        return real(max_workers=max_workers)

    monkeypatch.setattr(hf_cache, "ThreadPoolExecutor", recording)
    monkeypatch.setattr(hf_cache.os, "cpu_count", lambda: 64)
    blobs = str(model["repo"] / "blobs")
    absent = [f"{i:064x}" for i in range(1, 11)]
    done = []
    assert hf_cache.failing_blobs(blobs, names + absent, progress=lambda n, ok: done.append((n, ok))) == absent
    assert sorted(done) == sorted([(n, True) for n in names] + [(n, False) for n in absent])
    hf_cache.failing_blobs(blobs, names[:1])
    hf_cache.failing_blobs(blobs, names, workers=3)
    monkeypatch.setattr(hf_cache.os, "cpu_count", lambda: 2)
    hf_cache.failing_blobs(blobs, names)
    assert seen == [8, 1, 3, 2]  # at most 8 threads, at most one a blob, at most one a CPU


def test_plan_streams_takes_the_largest_first_and_at_least_one_stream():
    assert hf_cache.plan_streams({"b": 1, "c": 1, "a": 1}, 1) == [["a", "b", "c"]]  # equal sizes by name
    assert hf_cache.plan_streams({"a": 1, "b": 1, "c": 2}, 2) == [["c"], ["a", "b"]]
    assert hf_cache.plan_streams([("a", 1), ("b", 3)], 1) == [["b", "a"]]
    assert hf_cache.plan_streams({"a": 1, "b": 3}, 0) == [["b", "a"]]
    assert hf_cache.plan_streams({"a": 2, "b": 2}, "2") == [["a"], ["b"]]


def test_a_path_on_no_filesystem_ends_at_the_root(monkeypatch):
    monkeypatch.setattr(hf_cache.os.path, "exists", lambda _path: False)
    assert hf_cache.nearest_existing("/no/such/mount/x") == "/"


def test_node_manifest_without_blobs_to_hash(tmp_path):
    model = make_model(tmp_path)
    out = hf_cache.node_manifest({"repo": str(model["repo"]), "revision": REVISION})
    assert out["hash_failed"] == [] and out["manifest"]["complete"]
    assert out["hash_record"]["never_hashed"] == len(model["names"])
    assert not (model["repo"] / ".sparkops" / "hashed-blobs.json").exists()
    # what hf_cache_sync reads from it: space, ownership for the copy, and whether rsync is there
    assert set(out) == {
        "hash_record", "repo_path", "manifest", "free_bytes", "free_path", "rsync", "hash_failed", "uid", "gid",
    }  # fmt: skip
    assert (out["uid"], out["gid"], out["repo_path"]) == (os.getuid(), os.getgid(), str(model["repo"]))
    assert isinstance(out["free_bytes"], int) and out["free_bytes"] > 0  # another process may write meanwhile
    assert out["free_path"] == str(model["repo"])


@pytest.mark.parametrize("part", ["", ".", "..", "a/b", "a\0b"])
def test_a_folder_name_that_is_no_plain_name_is_refused(tmp_path, part):
    repo = tmp_path / "models--org--name"
    refused = pytest.raises(ValueError, match="is not a plain folder name")
    with refused, hf_cache.repo_subdir(str(repo), ["snapshots", part]):
        pass
    assert not (tmp_path / "models--org--b").exists()


def test_folders_are_made_0755(tmp_path):
    old = os.umask(0o022)
    try:
        with hf_cache.repo_subdir(str(tmp_path / "models--org--name"), ["snapshots", "r"]):
            pass
    finally:
        os.umask(old)
    assert (tmp_path / "models--org--name" / "snapshots" / "r").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "models--org--name" / "snapshots").stat().st_mode & 0o777 == 0o755


def test_a_snapshot_folder_named_like_an_unknown_branch_is_not_that_revision(tmp_path):
    model = make_model(tmp_path)
    (model["repo"] / "snapshots" / "no-such-branch").mkdir()
    m = hf_cache.build_manifest(str(model["repo"]), "no-such-branch")
    assert (m["revision"], m["revision_found"], m["links"]) == (None, False, {})


def test_a_linked_blob_that_is_absent_keeps_a_model_without_a_listing_incomplete(tmp_path):
    model = make_model(tmp_path)
    shard = model["names"]["model-00002-of-00003.safetensors"]
    (model["repo"] / "blobs" / shard).unlink()
    m = hf_cache.build_manifest(str(model["repo"]), REVISION)
    assert (m["expected_from"], m["missing_files"], m["missing_blobs"]) == ("links only", [], [shard])
    assert not m["complete"]
    assert hf_cache.completeness_problems(m) == [f"1 linked blob(s) are absent: {shard}"]


def test_hash_record_status_goes_on_past_an_absent_blob(tmp_path):
    model = make_model(tmp_path)
    names = sorted(model["names"].values())
    hf_cache.save_hash_record(str(model["repo"]), names[1:2])
    status = hf_cache.hash_record_status(str(model["repo"]), ["0" * 64, *names])
    assert status == {"unchanged": names[1:2], "changed_since_hashed": [], "never_hashed": names[:1] + names[2:]}


def test_a_broken_listing_or_index_falls_back_instead_of_crashing(tmp_path):
    model = make_model(tmp_path, index=True)
    repo = model["repo"]
    (repo / ".sparkops").mkdir()
    (repo / ".sparkops" / f"{REVISION}.json").write_text("{not json")
    m = hf_cache.build_manifest(str(repo), REVISION)
    assert (m["expected_from"], m["complete"]) == ("model index", True)
    index = repo / "snapshots" / REVISION / "model.safetensors.index.json"
    index.unlink()
    index.write_text(json.dumps({"metadata": {}}))  # no weight_map
    assert hf_cache.expected_files(str(repo), REVISION) == ({}, "links only")


def test_every_missing_file_is_named(tmp_path):
    model = make_model(tmp_path)
    write_listing(
        model["repo"], **{"a.json": {"size": 1, "blob_id": "a" * 40}, "b.json": {"size": 2, "blob_id": "b" * 40}}
    )
    m = hf_cache.build_manifest(str(model["repo"]), REVISION)
    assert m["missing_files"] == ["a.json", "b.json"]
    assert hf_cache.completeness_problems(m)[0] == "2 of 6 files listed by the hub listing are absent: a.json, b.json"


def test_a_missing_link_alone_is_not_in_sync():
    src = {"links": {"snapshots/r/x": "../../blobs/" + "a" * 64}}
    d = hf_cache.diff_manifests(src, {})
    assert (d["links_create"], d["copy"], d["in_sync"]) == (src["links"], {}, False)
    assert hf_cache.diff_manifests(src, src)["in_sync"]
    refs = hf_cache.diff_manifests({"refs": {"main": "c" * 40}}, {"refs": {"main": "d" * 40}})
    assert (refs["refs_update"], refs["copy"], refs["in_sync"]) == ({"main": "c" * 40}, {}, False)


def test_a_link_named_like_a_partial_download_is_none(tmp_path):
    model = make_model(tmp_path)
    (tmp_path / "elsewhere").write_bytes(b"x" * 5)
    (model["repo"] / "blobs" / ("e" * 64 + ".incomplete")).symlink_to(tmp_path / "elsewhere")
    m = hf_cache.build_manifest(str(model["repo"]), REVISION)
    assert (m["incomplete_downloads"], m["complete"]) == ({}, True)


def test_a_ref_that_holds_no_commit_is_not_followed(tmp_path):
    model = make_model(tmp_path)
    outside = tmp_path / "outside"
    (outside / "secret").mkdir(parents=True)
    (outside / "secret" / "key").write_text("x")
    (model["repo"] / "refs" / "evil").write_text("../../outside/secret")
    (model["repo"] / "snapshots" / "v1").mkdir()
    (model["repo"] / "refs" / "tag").write_text("v1")
    for ref in ("evil", "tag"):
        m = hf_cache.build_manifest(str(model["repo"]), ref)
        assert (m["revision"], m["revision_found"], m["files"], m["links"]) == (None, False, {}, {}), ref
    assert hf_cache.build_manifest(str(model["repo"]), "main")["revision"] == REVISION


def test_completeness_problems_name_at_most_five(tmp_path):
    model = make_model(tmp_path)
    extra = {f"f{i}.json": {"size": 1, "blob_id": f"{i:040x}"} for i in range(7)}
    write_listing(model["repo"], **extra)
    m = hf_cache.build_manifest(str(model["repo"]), REVISION)
    (first,) = hf_cache.completeness_problems(m)
    assert first == "7 of 11 files listed by the hub listing are absent: f0.json, f1.json, f2.json, f3.json, f4.json"
    assert hf_cache.completeness_problems(m, limit=1)[0].endswith("are absent: f0.json")


def test_node_mkdirs_makes_the_models_folders(tmp_path):
    repo = tmp_path / "models--org--m"
    assert hf_cache.node_mkdirs({"repo": str(repo)}) == {"repo": str(repo), "stale_temp_removed": []}
    assert sorted(p.name for p in repo.iterdir()) == ["blobs", "refs", "snapshots"]


def test_node_manifest_names_at_most_20_blobs_changed_since_hashed(tmp_path):
    repo = tmp_path / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    names = [f"{i:064x}" for i in range(1, 23)]
    for name in names:
        (repo / "blobs" / name).write_bytes(b"x")
    (repo / ".sparkops").mkdir()
    record = {"blobs": {n: {"size": 2, "mtime_ns": 0} for n in names}}  # all changed since
    (repo / ".sparkops" / "hashed-blobs.json").write_text(json.dumps(record))
    out = hf_cache.node_manifest({"repo": str(repo)})
    assert out["hash_record"]["changed_since_hashed"] == 22
    assert out["hash_record"]["changed_since_hashed_names"] == names[:20]


def test_a_link_with_another_target_alone_is_not_in_sync():
    src = {"links": {"snapshots/r/x": "../../blobs/" + "a" * 64}}
    dst = {"links": {"snapshots/r/x": "../../blobs/" + "b" * 64}}
    d = hf_cache.diff_manifests(src, dst)
    assert (d["links_fix"], d["links_create"], d["copy"], d["in_sync"]) == (src["links"], {}, {}, False)


def test_a_tree_cache_of_another_format_is_not_read(tmp_path):
    model = make_model(tmp_path)
    (model["repo"] / "trees").mkdir()
    files = {"config.json": {"size": 1, "blob_id": "a" * 40}, "other.json": {"size": 1, "blob_id": "b" * 40}}
    (model["repo"] / "trees" / f"{REVISION}.json").write_text(json.dumps({"format_version": 2, "files": files}))
    assert hf_cache.expected_files(str(model["repo"]), REVISION) == ({}, "links only")


def test_the_hash_record_goes_on_past_a_link_under_a_blob_name(tmp_path):
    model = make_model(tmp_path)
    name = model["names"]["config.json"]
    link = "c" * 64
    (model["repo"] / "blobs" / link).symlink_to(model["repo"] / "blobs" / name)
    hf_cache.save_hash_record(str(model["repo"]), [link, name])
    assert list(hf_cache.load_hash_record(str(model["repo"]))) == [name]
