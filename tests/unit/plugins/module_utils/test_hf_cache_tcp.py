"""transport=tcp: hf_cache's TemporaryReceiver (a target's end) and send_stream (the source's), for real
over loopback sockets on this machine, with real files; nothing leaves 127.0.0.0/8."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap
import os
import socket
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
    with receiver(dst) as (rcv, port):
        rc, msg = hf_cache.send_stream(channel(port), files, str(src), progress)
        assert (rc, msg) == (0, "")
    stopped = rcv.stop()  # a second stop is harmless and reports the same
    for rel in files:
        got = dst / rel
        assert got.read_bytes() == (src / rel).read_bytes(), rel
        assert got.stat().st_mode & 0o777 == 0o640 and got.stat().st_mtime == 1_700_000_000
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
    with receiver(dst) as (rcv, port):
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
    with receiver(dst) as (rcv, port):
        rc, msg = hf_cache.send_stream(channel(port, secret="a guess"), [rel], str(src), Progress())
        assert rc == 1 and "127.0.0.1" in msg
    assert rcv.stats["refused"] == ["wrong secret"]
    with receiver(dst, allow="127.0.0.2") as (rcv, port):
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
    with receiver(dst, io_timeout=io_timeout) as (rcv, port):
        conn = raw_client(port)
        with conn:
            hf_cache._send_msg(conn, {"name": name, "size": 1 << 20})
            conn.sendall(first_bytes)
            yield rcv, conn


@pytest.mark.parametrize(
    "name",
    ["../../outside", "blobs/../../outside", "snapshots/" + "a" * 40 + "/x", "blobs/not-a-hash", "blobs/" + "A" * 64],
)
def test_only_blobs_with_hash_names_can_be_written(repos, tmp_path, name):
    dst = repos[1]
    with receiver(dst) as (rcv, port):
        conn = raw_client(port)
        with conn:
            hf_cache._send_msg(conn, {"name": name, "size": 3})
            conn.sendall(b"bad")
            answer = hf_cache._recv_msg(conn)
    assert "only blobs/<hash name> are received" in answer["error"]
    assert rcv.stats["files"] == 0
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == []


def test_bytes_that_do_not_hash_to_the_name_never_get_it(repos):
    src, dst = repos
    rel = blob(src, 70000)
    good = blob(src, 1234, seed=1)
    data = bytearray((src / rel).read_bytes())
    data[40000] ^= 0x01  # what a bad cable or bad memory does: the same size, another content
    (src / rel).write_bytes(bytes(data))
    with receiver(dst) as (rcv, port):
        rc, msg = hf_cache.send_stream(channel(port), [good, rel], str(src), Progress())
    assert rc == 1 and "not to the blob's name" in msg
    assert (dst / good).exists() and not (dst / rel).exists() and temp_files(dst) == []
    assert rcv.stats["files"] == 1 and rcv.stop()["verified"] == [good.removeprefix("blobs/")]


def test_without_verify_nothing_is_hashed_or_recorded(repos):
    src, dst = repos
    rel = blob(src, 3000)
    (src / rel).write_bytes(b"x" * 3000)  # would fail a hash
    with receiver(dst, verify=False) as (rcv, port):
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
    with receiver(dst) as (rcv, port):
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
    start |= {"allow": "127.0.0.1", "secret": SECRET, "io_timeout": 20}
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
