"""transport=tcp: hf_cache's TemporaryReceiver (a target's end) and send_stream (the source's), for real
over loopback sockets on this machine, with real files; nothing leaves 127.0.0.0/8."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest
from ansible_collections.sparkops.cluster.plugins.module_utils import hf_cache, page_cache

SECRET = "one-time-secret-of-this-test"
# Sizes around O_DIRECT's alignment and the receiver's 4 MiB buffer: the unaligned end of a file is
# where an O_DIRECT writer goes wrong.
SIZES = (0, 1, 4095, 4096, 4097, (4 << 20) + 3, (9 << 20) - 1)


class Progress:
    def __init__(self):
        self.sizes = []

    def add(self, size):
        self.sizes.append(size)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def blob(directory, size: int, seed: int = 0) -> str:
    """A blob named by its sha256, as huggingface_hub stores LFS files; its repo-relative path."""
    data = hashlib.shake_256(b"%d-%d" % (seed, size)).digest(size) if size else b""
    name = hashlib.sha256(data).hexdigest()
    (directory / "blobs").mkdir(parents=True, exist_ok=True)
    (directory / "blobs" / name).write_bytes(data)
    os.chmod(directory / "blobs" / name, 0o640)
    os.utime(directory / "blobs" / name, (1_700_000_000, 1_700_000_000))
    return f"blobs/{name}"


@pytest.fixture
def repos(tmp_path):
    return tmp_path / "src" / "models--org--m", tmp_path / "dst" / "models--org--m"


def plan_of(src, files) -> dict:
    """What the source announces with tcp_plan before a copy: path -> size."""
    return {rel: (src / rel).stat().st_size for rel in files}


@contextlib.contextmanager
def receiver(dst, **kw):
    args = {"repo": str(dst), "address": "127.0.0.1", "port": free_port(), "allow": "127.0.0.1", "secret": SECRET}
    rcv = hf_cache.TemporaryReceiver(args | {"io_timeout": 20} | kw)
    try:
        yield rcv, args["port"]
    finally:
        rcv.stop()


def channel(port: int, secret: str = SECRET, source: str = "127.0.0.1") -> dict:
    return {"address": "127.0.0.1", "port": port, "source_address": source, "secret": secret, "io_timeout": 20}


def temp_files(dst) -> list:
    return [p.name for p in (dst / "blobs").iterdir() if p.name.startswith(".")]


def resident_pages(path) -> int:
    """Pages of ``path`` in the page cache, measured by the collection's own mincore(2) reading."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return -(-page_cache.resident_bytes(fd, os.fstat(fd).st_size) // mmap.PAGESIZE)
    finally:
        os.close(fd)


def test_blobs_arrive_whole_under_their_names_with_mode_mtime_and_no_temp_left(repos):
    src, dst = repos
    files = [blob(src, size) for size in SIZES]
    progress = Progress()
    with receiver(dst, plan=plan_of(src, files)) as (rcv, port):
        rc, msg = hf_cache.send_stream(channel(port), files, str(src), progress)
        assert (rc, msg) == (0, "")
    stopped = rcv.stop()  # a second stop is harmless and reports the same
    for rel in files:
        got = dst / rel
        assert got.read_bytes() == (src / rel).read_bytes(), rel
        # A fixed read-only mode whatever the source's file had (0640 here); the sent mtime.
        assert got.stat().st_mode & 0o7777 == 0o444 and got.stat().st_mtime == 1_700_000_000
    assert sorted(progress.sizes) == sorted(SIZES)
    assert stopped["files"] == len(SIZES) and stopped["bytes"] == sum(SIZES) and stopped["errors"] == []
    assert temp_files(dst) == []
    # Each was hashed on arrival and recorded: a later sizes check on that node trusts them.
    assert sorted(stopped["verified"]) == sorted(rel.removeprefix("blobs/") for rel in files)
    status = hf_cache.hash_record_status(str(dst), stopped["verified"])
    assert sorted(status["unchanged"]) == sorted(stopped["verified"])


def test_with_o_direct_the_received_weights_are_not_left_in_the_page_cache(repos):
    src, dst = repos
    rel = blob(src, 8 << 20)
    with receiver(dst, plan=plan_of(src, [rel])) as (rcv, port):
        if not rcv.direct:
            pytest.skip(f"{dst} is on a filesystem without O_DIRECT (tmpfs?): the buffered path is used")
        assert hf_cache.send_stream(channel(port), [rel], str(src), Progress()) == (0, "")
    assert rcv.write_mode() == "O_DIRECT"
    # Written through the cache, all 2048 pages would be resident; the tail is written buffered.
    assert resident_pages(dst / rel) <= 1
    # The control, so that the measure itself is trusted: a buffered copy is resident.
    (dst / "control").write_bytes((src / rel).read_bytes())
    assert resident_pages(dst / "control") > 1000


def test_wrong_secret_or_wrong_source_is_refused_and_nothing_is_written(repos):
    src, dst = repos
    rel = blob(src, 5000)
    with receiver(dst, plan=plan_of(src, [rel])) as (rcv, port):
        rc, msg = hf_cache.send_stream(channel(port, secret="a guess"), [rel], str(src), Progress())
        assert rc == 1 and "127.0.0.1" in msg
    assert rcv.stats["refused"] == ["wrong secret"]
    with receiver(dst, allow="127.0.0.2", plan=plan_of(src, [rel])) as (rcv, port):
        rc, msg = hf_cache.send_stream(channel(port), [rel], str(src), Progress())
        assert rc == 1
    assert rcv.stats["refused"] == ["127.0.0.1"]
    assert not (dst / rel).exists() and temp_files(dst) == []


def test_it_listens_on_its_address_only(repos):
    dst = repos[1]
    with receiver(dst) as (rcv, port), socket.socket() as s, pytest.raises(OSError):
        assert rcv.sock.getsockname() == ("127.0.0.1", port)
        s.settimeout(1)
        s.connect(("127.0.0.3", port))
    with socket.socket() as s, pytest.raises(OSError):  # and not at all once stopped
        s.settimeout(1)
        s.connect(("127.0.0.1", port))


def raw_client(port: int):
    """A client past the challenge, for what send_stream would never send."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=20)
    conn.sendall(hf_cache.tcp_auth(SECRET, hf_cache._recv_exact(conn, hf_cache.AUTH_NONCE_BYTES)))
    return conn


@contextlib.contextmanager
def half_sent_blob(dst, name: str, first_bytes: bytes, io_timeout: float):
    """A receiver, and a connection to it that announced a 1 MiB blob and sent only ``first_bytes``."""
    with receiver(dst, io_timeout=io_timeout, plan={name: 1 << 20}) as (rcv, port):
        conn = raw_client(port)
        with conn:
            hf_cache._send_msg(conn, {"name": name, "size": 1 << 20})
            conn.sendall(first_bytes)
            yield rcv, conn


@pytest.mark.parametrize(
    "name",
    [
        "../../outside",
        "blobs/../../outside",
        "snapshots/x",
        "blobs/not-a-hash",
        "blobs/" + "A" * 64,
        ".sparkops/hashed-blobs.json",
        "refs/main",
        "/etc/cron.d/x",
        "trees/../../x.json",
    ],
)
def test_only_files_a_cache_holds_can_be_written(repos, tmp_path, name):
    dst = repos[1]
    with receiver(dst) as (rcv, port):
        conn = raw_client(port)
        with conn:
            hf_cache._send_msg(conn, {"name": name, "size": 3})
            conn.sendall(b"bad")
            answer = hf_cache._recv_msg(conn)
    assert "only blobs/<hash name>, the Hub's file list and snapshot files are received" in answer["error"]
    assert rcv.stats["files"] == 0
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == []
    with pytest.raises(ValueError, match="refusing to plan"):
        rcv.allow({name: 3})


def test_bytes_that_do_not_hash_to_the_name_never_get_it(repos):
    src, dst = repos
    rel = blob(src, 70000)
    good = blob(src, 1234, seed=1)
    data = bytearray((src / rel).read_bytes())
    data[40000] ^= 0x01  # what a bad cable or bad memory does: the same size, another content
    (src / rel).write_bytes(bytes(data))
    with receiver(dst, plan=plan_of(src, [good, rel])) as (rcv, port):
        rc, msg = hf_cache.send_stream(channel(port), [good, rel], str(src), Progress())
    assert rc == 1 and "not to the blob's name" in msg
    assert (dst / good).exists() and not (dst / rel).exists() and temp_files(dst) == []
    assert rcv.stats["files"] == 1 and rcv.stop()["verified"] == [good.removeprefix("blobs/")]


def test_without_verify_nothing_is_hashed_or_recorded(repos):
    src, dst = repos
    rel = blob(src, 3000)
    (src / rel).write_bytes(b"x" * 3000)  # would fail a hash
    with receiver(dst, verify=False, plan=plan_of(src, [rel])) as (rcv, port):
        assert hf_cache.send_stream(channel(port), [rel], str(src), Progress()) == (0, "")
    assert (dst / rel).read_bytes() == b"x" * 3000
    assert rcv.stop()["verified"] == [] and not (dst / ".sparkops").exists()


def test_a_stalled_sender_fails_after_the_io_timeout_and_leaves_no_temp(repos):
    dst = repos[1]
    name = "blobs/" + "b" * 64
    with half_sent_blob(dst, name, b"only a little", io_timeout=1) as (rcv, conn):
        started = time.monotonic()
        answer = hf_cache._recv_msg(conn)  # the receiver gives up and says why
        waited = time.monotonic() - started
    assert "timed out" in answer["error"] and 0.5 < waited < 10
    assert temp_files(dst) == [] and not (dst / name).exists()
    assert rcv.stats["files"] == 0


def test_streams_run_side_by_side(repos):
    src, dst = repos
    files = [blob(src, 300000 + i, seed=i) for i in range(6)]
    results = []
    with receiver(dst, plan=plan_of(src, files)) as (rcv, port):
        threads = [
            threading.Thread(
                target=lambda part: results.append(hf_cache.send_stream(channel(port), part, str(src), Progress())),
                args=(files[i::3],),
            )
            for i in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert results == [(0, "")] * 3
    assert all((dst / rel).read_bytes() == (src / rel).read_bytes() for rel in files)


def test_remote_main_starts_and_stops_the_receiver_and_stops_it_at_eof(repos):
    src, dst = repos
    rel = blob(src, 10000)
    port = free_port()
    start = {"action": "tcp_start", "repo": str(dst), "address": "127.0.0.1", "port": port}
    start |= {"allow": "127.0.0.1", "secret": SECRET, "io_timeout": 20, "plan": plan_of(src, [rel])}
    control_r, control_w = os.pipe()
    out = io.StringIO()
    session = threading.Thread(target=hf_cache.remote_main, args=(os.fdopen(control_r, "rb"), out))
    session.start()
    with os.fdopen(control_w, "wb") as control:
        control.write(json.dumps(start).encode() + b"\n")
        control.flush()
        deadline = time.monotonic() + 10
        while hf_cache.RESULT_MARK not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert hf_cache.send_stream(channel(port), [rel], str(src), Progress()) == (0, "")
    # EOF on the channel (the source died): the receiver is stopped, its port closed.
    session.join(timeout=30)
    assert not session.is_alive()
    first = json.loads(out.getvalue().splitlines()[0][len(hf_cache.RESULT_MARK) :])
    assert first["write"] in ("O_DIRECT", "buffered, then dropped from the page cache")
    assert (dst / rel).exists()
    with socket.socket() as s, pytest.raises(OSError):
        s.settimeout(1)
        s.connect(("127.0.0.1", port))


def test_stop_does_not_wait_for_a_stalled_sender(repos):
    # The session ends (the source module failed or was killed) while a stream is stuck midway: the
    # receiver must not sit out its io_timeout (300 s by default) before the session can end.
    dst = repos[1]
    name = "blobs/" + "c" * 64
    with half_sent_blob(dst, name, b"x" * 1000, io_timeout=300) as (rcv, _conn):
        deadline = time.monotonic() + 10
        while not temp_files(dst) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert temp_files(dst), "the receiver never started the blob"
        started = time.monotonic()
        rcv.stop()
        assert time.monotonic() - started < 10
    assert temp_files(dst) == [] and not (dst / name).exists()


COMMIT = "c" * 40


def plain(directory, rel: str, data: bytes) -> str:
    (directory / rel).parent.mkdir(parents=True, exist_ok=True)
    (directory / rel).write_bytes(data)
    os.chmod(directory / rel, 0o6777)  # whatever the source holds, the target gets a fixed mode
    return rel


def test_the_hubs_file_list_tree_cache_and_snapshot_files_arrive_too(repos):
    # issue 22: with the defaults (source hub, transport tcp) the Hub's file list is on every copy list.
    src, dst = repos
    files = [
        blob(src, 5000),
        plain(src, f".sparkops/{COMMIT}.json", b'{"files": {}}'),
        plain(src, f"trees/{COMMIT}.json", b'{"format_version": 1}'),
        plain(src, f"snapshots/{COMMIT}/original/params.json", b"{}"),
    ]
    with receiver(dst, plan=plan_of(src, files)) as (rcv, port):
        assert hf_cache.send_stream(channel(port), files, str(src), Progress()) == (0, "")
    stopped = rcv.stop()
    assert stopped["files"] == 4 and stopped["errors"] == []
    for rel in files:
        assert (dst / rel).read_bytes() == (src / rel).read_bytes(), rel
        want = 0o444 if rel.startswith("blobs/") else 0o644
        assert (dst / rel).stat().st_mode & 0o7777 == want, rel
    # Only blobs are hashed by name; the others are checked by size after the copy.
    assert stopped["verified"] == [files[0].removeprefix("blobs/")]
    assert sorted(p.name for p in dst.rglob(".*") if p.is_file() and "sparkops-tmp" in p.name) == []


def hashes_of(src, files) -> dict:
    """What the source plans besides the sizes: the sha256 of every file its name does not check."""
    return {rel: hashlib.sha256((src / rel).read_bytes()).hexdigest() for rel in files if not rel.startswith("blobs/")}


def test_lists_and_snapshot_files_arrive_only_with_the_hash_the_source_planned(repos):
    # After the handshake a connection is plain TCP: only blobs were checked (by their name); a list or a
    # snapshot file of the planned size with other bytes was written as it came.
    src, dst = repos
    files = [
        plain(src, f".sparkops/{COMMIT}.json", b'{"files": {}}'),
        plain(src, f"trees/{COMMIT}.json", b'{"format_version": 1}'),
        plain(src, f"snapshots/{COMMIT}/original/params.json", b'{"dim": 4096}'),
    ]
    with receiver(dst, plan=plan_of(src, files), hashes=hashes_of(src, files)) as (rcv, port):
        for rel in files:
            forged = (src / rel).read_bytes().replace(b"{", b"[", 1)  # same size, other bytes
            conn = raw_client(port)
            with conn:
                hf_cache._send_msg(conn, {"name": rel, "size": len(forged)})
                conn.sendall(forged)
                answer = hf_cache._recv_msg(conn)
            assert "not to the hash the source planned" in answer["error"], rel
            assert not (dst / rel).exists()
        assert hf_cache.send_stream(channel(port), files, str(src), Progress()) == (0, "")
    assert all((dst / rel).read_bytes() == (src / rel).read_bytes() for rel in files)
    assert [p.name for p in dst.rglob(".*") if p.is_file()] == []  # no temporary file left


def test_remote_main_takes_the_hashes_with_the_plan(repos):
    src, dst = repos
    rel = plain(src, f"trees/{COMMIT}.json", b'{"format_version": 1}')
    start = {"action": "tcp_start", "repo": str(dst), "address": "127.0.0.1", "port": free_port()}
    lines = [
        json.dumps(start | {"allow": "127.0.0.1", "secret": SECRET}),
        json.dumps({"action": "tcp_plan", "files": plan_of(src, [rel]), "hashes": hashes_of(src, [rel])}),
        json.dumps({"action": "tcp_plan", "files": plan_of(src, [rel]), "hashes": {rel: "not-a-digest"}}),
        json.dumps({"action": "tcp_stop"}),
    ]
    out = io.StringIO()
    hf_cache.remote_main(io.BytesIO(("\n".join(lines) + "\n").encode()), out)
    results = [json.loads(line[len(hf_cache.RESULT_MARK) :]) for line in out.getvalue().splitlines()]
    assert results[1] == {"planned": 1, "hashed": 1}
    assert "not a planned file's sha256" in results[2]["error"]


@pytest.mark.parametrize(
    "hashes",
    [
        {"blobs/" + "d" * 64: "d" * 64},  # a blob is checked by its name
        {f"trees/{COMMIT}.json": "not-a-digest"},
        {f"snapshots/{COMMIT}/unplanned.json": "0" * 64},
        ["not", "a", "mapping"],
    ],
)
def test_a_bad_planned_hash_is_refused_and_nothing_is_planned(repos, hashes):
    src, dst = repos
    files = {"blobs/" + "d" * 64: 3, f"trees/{COMMIT}.json": 5}
    with receiver(dst) as (rcv, _port):
        with pytest.raises(ValueError, match="hash"):
            rcv.allow(files, hashes)
        assert rcv.plan == {} and rcv.hashes == {}


def test_only_the_planned_names_with_the_planned_sizes_are_received(repos):
    src, dst = repos
    planned, unplanned = blob(src, 3000), blob(src, 4000, seed=2)
    with receiver(dst, plan=plan_of(src, [planned])) as (rcv, port):
        rc, msg = hf_cache.send_stream(channel(port), [unplanned], str(src), Progress())
        assert rc == 1 and "not in this copy's plan" in msg
        conn = raw_client(port)
        with conn:
            hf_cache._send_msg(conn, {"name": planned, "size": 2999})
            conn.sendall(b"x" * 2999)
            answer = hf_cache._recv_msg(conn)
        assert "2999 bytes announced, the plan says 3000" in answer["error"]
        # A later tcp_plan (follow mode forwards in rounds) adds to what may come.
        rcv.allow(plan_of(src, [unplanned]))
        assert hf_cache.send_stream(channel(port), [unplanned], str(src), Progress()) == (0, "")
    assert not (dst / planned).exists() and (dst / unplanned).exists()


@pytest.mark.parametrize(
    "raw",
    [
        b"not json at all",
        b"[1, 2, 3]",
        b'"a string"',
        b'{"name": "blobs/' + b"d" * 64 + b'", "size": true}',
        b'{"name": "blobs/' + b"d" * 64 + b'", "size": 3, "mtime": "yesterday"}',
        b'{"name": ["blobs"], "size": 3}',
        b"\xff\xfe\x00",
    ],
)
def test_every_malformed_header_is_answered_with_an_error_and_the_receiver_goes_on(repos, raw):
    src, dst = repos
    rel = blob(src, 3)
    plan = plan_of(src, [rel]) | {"blobs/" + "d" * 64: 3}
    with receiver(dst, plan=plan) as (rcv, port):
        conn = raw_client(port)
        with conn:
            conn.sendall(hf_cache.TCP_HEADER.pack(len(raw)) + raw)
            answer = hf_cache._recv_msg(conn)
        assert set(answer) == {"error"} and answer["error"]
        assert "Traceback" not in answer["error"]
        # The next sender is served as usual.
        assert hf_cache.send_stream(channel(port), [rel], str(src), Progress()) == (0, "")
    assert rcv.stop()["errors"] == [answer["error"]]


def test_an_oversized_header_is_answered_with_an_error(repos):
    dst = repos[1]
    with receiver(dst) as (rcv, port):
        conn = raw_client(port)
        with conn:
            conn.sendall(hf_cache.TCP_HEADER.pack(1 << 30))
            answer = hf_cache._recv_msg(conn)
    assert "not a sparkops sender" in answer["error"]


def _send_streams(port, src, parts) -> list:
    results = []
    threads = [
        threading.Thread(
            target=lambda part: results.append(hf_cache.send_stream(channel(port), part, str(src), Progress())),
            args=(part,),
        )
        for part in parts
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_idle_connections_take_no_stream_slot_and_the_sender_is_served_at_once(repos):
    # Three connections from the source's address that never answer the challenge (anyone on that host can
    # open them) took the streams + 1 slots before: the real sender's 2 streams were closed, 5 times in 6.
    src, dst = repos
    files = [blob(src, 5000 + i, seed=i) for i in range(4)]
    with receiver(dst, plan=plan_of(src, files), max_conns=3, handshake_timeout=30) as (rcv, port):
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _conn in range(3)]
        try:
            for s in idle:
                assert len(s.recv(64)) == hf_cache.AUTH_NONCE_BYTES  # challenged, and left waiting
            started = time.monotonic()
            assert _send_streams(port, src, [files[0::2], files[1::2]]) == [(0, "")] * 2
            assert time.monotonic() - started < 10  # not after the idle ones' handshake deadline
        finally:
            for s in idle:
                s.close()
    assert all((dst / rel).read_bytes() == (src / rel).read_bytes() for rel in files)


def test_a_flood_of_idle_connections_is_capped_and_timed_out_and_the_sender_is_served(repos):
    src, dst = repos
    rel = blob(src, 7000)
    with receiver(dst, plan=plan_of(src, [rel]), max_conns=3, handshake_timeout=3) as (rcv, port):
        assert rcv.max_pending == 16
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _conn in range(40)]
        try:
            started = time.monotonic()
            # The newest 16 wait for their answer; each newer one dropped the oldest waiting one.
            closed = 0
            for s in idle[:24]:
                s.settimeout(5)
                while s.recv(64):
                    pass
                closed += 1
            assert closed == 24 and time.monotonic() - started < 2.5  # at once, not at the deadline
            # While the 16 wait, the real sender is served (its connection drops the oldest of them).
            assert hf_cache.send_stream(channel(port), [rel], str(src), Progress()) == (0, "")
            # The ones that never answer are dropped after the handshake deadline.
            for s in idle[24:]:
                s.settimeout(5)
                while s.recv(64):
                    pass
            assert time.monotonic() - started < 8
        finally:
            for s in idle:
                s.close()
    stopped = rcv.stop()
    assert stopped["files"] == 1 and len(stopped["refused"]) <= hf_cache.MAX_REFUSALS_KEPT
    assert any("more than 16 connections without an answer yet" in r for r in stopped["refused"])
    assert not rcv.pending and not rcv.conns


def test_answered_connections_are_still_capped_at_the_streams_plus_one(repos):
    src, dst = repos
    rel = blob(src, 3000)
    with receiver(dst, plan=plan_of(src, [rel])) as (rcv, port):
        rcv.max_conns = 2
        held = [raw_client(port) for _conn in range(2)]
        try:
            extra = raw_client(port)  # answered, but both slots are taken: closed
            extra.settimeout(5)
            assert extra.recv(64) == b""
            extra.close()
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 5
        while rcv.conns and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hf_cache.send_stream(channel(port), [rel], str(src), Progress()) == (0, "")
    assert any("more than 2 connections" in r for r in rcv.stop()["refused"])


def test_nothing_is_written_through_a_link_swapped_into_the_target(repos, tmp_path):
    # issue 23: .sparkops or a snapshot folder replaced by a link to elsewhere (by a local user, or by a
    # crafted snapshot of an earlier sync) must not lead the receiver's write or the hash record out.
    src, dst = repos
    outside = tmp_path / "outside"
    outside.mkdir()
    files = [blob(src, 100), plain(src, f".sparkops/{COMMIT}.json", b"{}"), plain(src, f"snapshots/{COMMIT}/a", b"1")]
    (dst / "blobs").mkdir(parents=True)
    (dst / ".sparkops").symlink_to(outside)
    (dst / "snapshots").symlink_to(outside)
    with receiver(dst, plan=plan_of(src, files)) as (rcv, port):
        for rel in files[1:]:
            rc, msg = hf_cache.send_stream(channel(port), [rel], str(src), Progress())
            assert rc == 1 and "is a link or not a folder" in msg, msg
        assert hf_cache.send_stream(channel(port), files[:1], str(src), Progress()) == (0, "")
    stopped = rcv.stop()  # the hash record cannot be written through the link: reported, no crash
    assert any("hash record was not written" in e for e in stopped["errors"])
    assert list(outside.iterdir()) == []


# --- transport=rsync's temporary daemon, on loopback (issue 30: its start and stop had no unit test) ---


@pytest.mark.skipif(not shutil.which("rsync"), reason="rsync is not installed on this machine")
def test_remote_main_starts_a_write_only_rsync_daemon_on_its_address_and_stops_it(tmp_path):
    port = free_port()
    start = {"action": "rsyncd_start", "address": "127.0.0.1", "port": port, "allow": "127.0.0.1"}
    start |= {"user": "sparkops", "secret": SECRET, "path": str(tmp_path / "models--org--m"), "start_timeout": 10}
    lines = [json.dumps(start), json.dumps(start), json.dumps({"action": "rsyncd_stop"})]
    out = io.StringIO()
    control = io.BytesIO(("\n".join(lines) + "\n").encode())
    hf_cache.remote_main(control, out)
    results = [json.loads(line[len(hf_cache.RESULT_MARK) :]) for line in out.getvalue().splitlines()]
    pid = results[0]["pid"]
    assert isinstance(pid, int) and pid > 0
    assert "already runs" in results[1]["error"]  # one daemon a session
    assert results[2] == {"stopped": True, "pid": pid}
    assert (tmp_path / "models--org--m").is_dir()
    with socket.socket() as s, pytest.raises(OSError):  # stopped: its port is closed
        s.settimeout(1)
        s.connect(("127.0.0.1", port))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.skipif(not shutil.which("rsync"), reason="rsync is not installed on this machine")
def test_the_rsync_daemon_listens_until_stopped_and_leaves_no_secret_behind(tmp_path, monkeypatch):
    port = free_port()
    args = {"address": "127.0.0.1", "port": port, "allow": "127.0.0.1", "user": "sparkops", "secret": SECRET}
    daemon = hf_cache.TemporaryRsyncd(args | {"path": str(tmp_path / "m")})
    try:
        assert daemon.proc.poll() is None
        secrets_file = os.path.join(daemon.tmp, "secrets")
        assert os.stat(secrets_file).st_mode & 0o777 == 0o600  # rsync's strict modes refuse anything looser
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            assert conn.recv(64).startswith(b"@RSYNCD:")  # the daemon's greeting
    finally:
        stopped = daemon.stop()
    assert stopped["stopped"] and not os.path.exists(daemon.tmp)
    # A daemon that cannot start (here: a "rsync" that exits at once) says so and leaves no file behind.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(hf_cache.tempfile, "tempdir", str(scratch))
    with pytest.raises(RuntimeError, match=f"rsync daemon did not start on 127.0.0.1:{port}"):
        hf_cache.TemporaryRsyncd(args | {"path": str(tmp_path / "m"), "rsync": "false", "start_timeout": 5})
    assert list(scratch.iterdir()) == []


def test_stop_group_ends_a_process_group(tmp_path):
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)  # noqa: S607 - coreutils sleep
    try:
        hf_cache._stop_group(proc, grace_s=5.0)
        assert proc.returncode == -15  # SIGTERM within the grace period
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_refused_folder_name_names_the_whole_path(tmp_path):
    fd = hf_cache.open_repo(str(tmp_path / "models--org--m"))
    try:
        with pytest.raises(ValueError, match=r"refusing 'snapshots/r/\.\.': '\.\.' is not a plain folder name"):
            hf_cache.open_subdir(fd, ["snapshots", "r", ".."])
    finally:
        os.close(fd)


@pytest.mark.skipif(not shutil.which("rsync"), reason="rsync is not installed on this machine")
@pytest.mark.parametrize("option", ["--delete", "--del", "--delete-after", "--delete-excluded"])
def test_the_rsync_daemon_refuses_to_delete_anything(tmp_path, option):
    # A client with the secret (the source, or whoever read it) could otherwise empty the model's folder.
    port = free_port()
    target = tmp_path / "m"
    (target / "blobs").mkdir(parents=True)
    (target / "blobs" / "kept").write_bytes(b"weights")
    empty = tmp_path / "empty"
    (empty / "blobs").mkdir(parents=True)
    args = {"address": "127.0.0.1", "port": port, "allow": "127.0.0.1", "user": "sparkops", "secret": SECRET}
    daemon = hf_cache.TemporaryRsyncd(args | {"path": str(target)})
    try:
        res = subprocess.run(  # noqa: S603 - fixed argv, loopback only
            [shutil.which("rsync"), "-r", option, f"{empty}/", f"rsync://sparkops@127.0.0.1:{port}/hf/"],
            env={**os.environ, "RSYNC_PASSWORD": SECRET},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        daemon.stop()
    assert res.returncode != 0, res.stdout + res.stderr
    assert "refuse" in res.stderr, res.stderr
    assert (target / "blobs" / "kept").read_bytes() == b"weights"


def test_the_module_plans_the_hash_of_every_file_its_name_does_not_check(repos):
    from ansible_collections.sparkops.cluster.plugins.modules import hf_cache_sync  # noqa: PLC0415 - the module

    src, _dst = repos
    files = [
        blob(src, 3000),
        plain(src, f"trees/{COMMIT}.json", b"[]"),
        plain(src, f"snapshots/{COMMIT}/a.json", b"{}"),
    ]
    calls = []

    class Target:
        def call(self, action, **args):
            calls.append((action, args))
            return {}

    class Module:
        params = {"transport": "tcp", "streams": 2}

    def stream(names, src_repo, progress):
        return 0, ""

    hf_cache_sync.copy_files(Module(), Target(), stream, plan_of(src, files), src_repo=str(src), progress=Progress())
    ((action, args),) = calls
    assert action == "tcp_plan" and args["files"] == plan_of(src, files)
    assert args["hashes"] == hashes_of(src, files) and len(args["hashes"]) == 2
