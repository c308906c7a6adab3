"""A small Hugging Face Hub on loopback, speaking what the real ``huggingface_hub`` client asks.

Built from the client's source at the versions the system tests run (cited in tests/system/README.md)
and from the requests the real client was seen to make against it (``HubServer.log``):

* ``GET /api/models/<id>`` and ``/api/models/<id>/revision/<rev>`` - model info: ``sha``, ``gated``,
  ``siblings`` (``rfilename``; with ``?blobs=true`` also ``size``, ``blobId`` and ``lfs``).
* ``GET /api/models/<id>/tree/<rev>[/<path>]`` - the file listing (``type``, ``oid``, ``size``, ``path``,
  ``lfs``), one page (no ``Link`` header).
* ``HEAD|GET /<id>/resolve/<rev>/<path>`` - a small file: 200 with ``ETag`` (its git blob id),
  ``X-Repo-Commit`` and ``Content-Length``; an LFS file: 302 to ``/cdn-lfs/<sha256>`` (absolute URL)
  on ANOTHER host (127.0.0.2, like the Hub's CDN: the 1.x client follows only redirects that stay on the
  Hub host and reads the metadata from the 302 itself) with ``X-Linked-Etag`` (the sha256),
  ``X-Linked-Size`` and ``X-Repo-Commit``.
* ``GET /cdn-lfs/<sha256>`` on the CDN host - the bytes, with ``Range: bytes=N-`` answered 206 + ``Content-Range``.
* Errors as the Hub sends them, with ``X-Error-Code``/``X-Error-Message`` (which the client maps to its
  exceptions in ``hf_raise_for_status``): 404 ``RevisionNotFound`` for an unknown revision, 404
  ``EntryNotFound`` for an unknown file, 404 ``RepoNotFound`` for an unknown repo, 401 ``GatedRepo``
  for a file of a gated repo requested without the right token (its info and file list stay public).

Faults for tests: ``cut[sha256] = n`` never sends that blob's bytes past offset ``n``: each response
announces the full ``Content-Length``, sends what lies before ``n`` and drops the connection (a link
that dies there, also for the client's own retries); ``corrupt.add(sha256)`` serves that blob with
one byte flipped (same size), which only a hash can see.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LFS_THRESHOLD = 10 * 1024  # files above this are "LFS" here (the Hub's rule is .gitattributes; size is enough)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git object id


def lfs_pointer(data: bytes) -> bytes:
    return b"version https://git-lfs.github.com/spec/v1\n" + b"oid sha256:%s\nsize %d\n" % (
        hashlib.sha256(data).hexdigest().encode(),
        len(data),
    )


@dataclass
class HubFile:
    path: str
    data: bytes

    @property
    def lfs(self) -> bool:
        return len(self.data) > LFS_THRESHOLD

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def oid(self) -> str:
        """The git blob id: of the LFS pointer for an LFS file, of the content otherwise (as on the Hub)."""
        return git_blob_id(lfs_pointer(self.data) if self.lfs else self.data)

    @property
    def etag(self) -> str:
        """What the client names the blob by: sha256 for LFS, the git blob id otherwise."""
        return self.sha256 if self.lfs else self.oid


@dataclass
class HubRepo:
    repo_id: str
    commits: dict = field(default_factory=dict)  # commit sha -> {path: HubFile}
    refs: dict = field(default_factory=dict)  # branch -> commit sha
    gated: bool = False
    tokens: tuple = ()  # tokens that may read a gated repo
    # Xet-backed: HEAD on an LFS file also says X-Xet-Hash and X-Xet-Refresh-Route, as the Hub does for a
    # repository stored on Xet (0.36.2 utils/_xet.py parse_xet_file_data_from_response reads them). This
    # server has no CAS: the refresh route answers 404, so a client that takes xet_get fails (and the log
    # shows it asked), while a client with Xet disabled downloads over HTTP (the 302 to the CDN).
    xet: bool = False

    def add_commit(self, files: dict, ref: str = "main", sha: str | None = None) -> str:
        """Add a commit of ``files`` (path -> bytes); returns its sha (derived from the content unless given)."""
        if sha is None:
            h = hashlib.sha1()  # noqa: S324 - a stand-in commit id, not security
            for path in sorted(files):
                h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
            sha = h.hexdigest()
        self.commits[sha] = {p: HubFile(p, d) for p, d in files.items()}
        self.refs[ref] = sha
        return sha

    def resolve(self, rev: str) -> str | None:
        rev = unquote(rev)
        if rev in self.refs:
            return self.refs[rev]
        return rev if rev in self.commits else None


class HubServer:
    """``with HubServer() as hub: hub.add_repo(...)``; ``hub.endpoint`` is what HF_ENDPOINT gets."""

    def __init__(self, address: str = "127.0.0.1", cdn_address: str = "127.0.0.2", port: int = 0, cdn_port: int = 0):
        self.repos: dict = {}
        self.cut: dict = {}
        self.corrupt: set = set()
        self.delay_s = 0.0  # each request waits this long first (a slow link, to watch a download run)
        self.log: list = []
        self.echo = False
        self.lock = threading.Lock()
        hub = self

        class Handler(_Handler):
            server_hub = hub

        self.httpd = ThreadingHTTPServer((address, port), Handler)
        self.cdn = ThreadingHTTPServer((cdn_address, cdn_port), Handler)
        self.threads = []
        for srv in (self.httpd, self.cdn):
            srv.daemon_threads = True
            self.threads.append(threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True))

    @property
    def endpoint(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(
        self,
        repo_id: str,
        files: dict,
        *,
        gated: bool = False,
        tokens: tuple = (),
        xet: bool = False,
        commit: str | None = None,
    ) -> HubRepo:
        repo = HubRepo(repo_id, gated=gated, tokens=tokens, xet=xet)
        repo.add_commit(files, sha=commit)
        self.repos[repo_id] = repo
        return repo

    def requests(self, method: str | None = None, prefix: str = "") -> list:
        with self.lock:
            return [r for r in self.log if (method is None or r["method"] == method) and r["path"].startswith(prefix)]

    def __enter__(self) -> HubServer:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        for srv, t in zip((self.httpd, self.cdn), self.threads, strict=True):
            srv.shutdown()
            srv.server_close()
            t.join(timeout=10)


RESOLVE_RE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
API_RE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?P<path>/.*)?)?$")
CDN_RE = re.compile(r"^/cdn-lfs/(?P<sha>[0-9a-f]{64})$")
RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")


class _Handler(BaseHTTPRequestHandler):
    server_hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: the hub keeps its own log
        pass

    # -- helpers
    def _record(self, status: int) -> None:
        url = urlsplit(self.path)
        with self.server_hub.lock:
            self.server_hub.log.append(
                {
                    "method": self.command,
                    "path": unquote(url.path),
                    "query": parse_qs(url.query),
                    "range": self.headers.get("Range"),
                    "authorization": bool(self.headers.get("Authorization")),
                    "user_agent": self.headers.get("User-Agent", ""),
                    "status": status,
                    "time": time.monotonic(),
                }
            )
            if self.server_hub.echo:  # the simulated cluster's Hub: one line per request in its log
                entry = self.server_hub.log[-1]
                print(
                    f"{self.client_address[0]} {self.command} {entry['path']} {status} {entry['user_agent']}",
                    flush=True,
                )

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, ctype: str = "application/json"):
        self._record(status)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, commit: str | None = None):
        headers = {"X-Error-Code": code, "X-Error-Message": message}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(status, json.dumps({"error": message}).encode(), headers)

    def _authorized(self, repo: HubRepo) -> bool:
        if not repo.gated:
            return True
        auth = self.headers.get("Authorization", "")
        return auth.startswith("Bearer ") and auth[len("Bearer ") :] in repo.tokens

    # -- routes
    def do_HEAD(self):  # noqa: N802 - http.server's naming
        self._route()

    def do_GET(self):  # noqa: N802
        self._route()

    def _route(self):
        if self.server_hub.delay_s:
            time.sleep(self.server_hub.delay_s)
        path = unquote(urlsplit(self.path).path)
        query = parse_qs(urlsplit(self.path).query)
        try:
            if m := CDN_RE.match(path):
                return self._cdn(m["sha"])
            if m := API_RE.match(path):
                return self._api(m["repo"], m["kind"], m["rev"], (m["path"] or "").lstrip("/"), query)
            if m := RESOLVE_RE.match(path):
                return self._resolve(m["repo"], m["rev"], m["path"])
            return self._error(404, "EntryNotFound", f"{path} does not exist on this hub")
        except (BrokenPipeError, ConnectionResetError):
            return None

    def _repo_or_404(self, repo_id: str) -> HubRepo | None:
        repo = self.server_hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
        return repo

    def _api(self, repo_id: str, kind: str | None, rev: str | None, sub: str, query: dict):
        repo = self._repo_or_404(repo_id)
        if repo is None:
            return None
        commit = repo.resolve(rev or "main")
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
        files = repo.commits[commit]
        if kind == "tree":
            # A gated repo's file list is public (the Hub shows it); its files are not.
            entries = []
            for f in sorted(files.values(), key=lambda f: f.path):
                if sub and not f.path.startswith(sub.rstrip("/") + "/"):
                    continue
                entry = {"type": "file", "oid": f.oid, "size": len(f.data), "path": f.path}
                if f.lfs:
                    entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": len(lfs_pointer(f.data))}
                entries.append(entry)
            return self._send(200, json.dumps(entries).encode())
        blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for f in sorted(files.values(), key=lambda f: f.path):
            s = {"rfilename": f.path}
            if blobs:
                s.update(size=len(f.data), blobId=f.oid)
                if f.lfs:
                    s["lfs"] = {"sha256": f.sha256, "size": len(f.data), "pointerSize": len(lfs_pointer(f.data))}
            siblings.append(s)
        info = {
            "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],  # noqa: S324 - an id, not security
            "id": repo_id,
            "modelId": repo_id,
            "sha": commit,
            "private": False,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "lastModified": "2026-01-01T00:00:00.000Z",
            "createdAt": "2026-01-01T00:00:00.000Z",
            "siblings": siblings,
        }
        return self._send(200, json.dumps(info).encode())

    def _resolve(self, repo_id: str, rev: str, path: str):
        repo = self._repo_or_404(repo_id)
        if repo is None:
            return None
        commit = repo.resolve(rev)
        if commit is None:
            return self._error(404, "RevisionNotFound", f"Invalid rev id: {unquote(rev)}")
        if not self._authorized(repo):
            return self._error(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be authenticated "
                "to access it. Please log in.",
                commit,
            )
        f = repo.commits[commit].get(path)
        if f is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist at {commit}", commit)
        common = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
        if f.lfs:
            host, port = self.server_hub.cdn.server_address[:2]
            headers = {
                **common,
                "Location": f"http://{host}:{port}/cdn-lfs/{f.sha256}",
                "ETag": f'"{f.oid}"',
                "X-Linked-Etag": f'"{f.sha256}"',
                "X-Linked-Size": len(f.data),
            }
            if repo.xet:
                headers["X-Xet-Hash"] = hashlib.sha256(b"xet:" + f.data).hexdigest()
                # Absolute on huggingface.co as the Hub sends it; the client rewrites that prefix to its
                # endpoint (0.36.2 utils/_xet.py parse_xet_file_data_from_response, HUGGINGFACE_CO_URL_HOME).
                headers["X-Xet-Refresh-Route"] = f"https://huggingface.co/api/models/{repo_id}/xet-read-token/{commit}"
            return self._send(302, b"", headers, ctype="text/plain")
        return self._body(f.data, {**common, "ETag": f'"{f.oid}"'}, f.etag)

    def _cdn(self, sha: str):
        for repo in self.server_hub.repos.values():
            for files in repo.commits.values():
                for f in files.values():
                    if f.lfs and f.sha256 == sha:
                        return self._body(f.data, {"ETag": f'"{sha}"'}, sha)
        return self._error(404, "EntryNotFound", f"no blob {sha}")

    def _body(self, data: bytes, headers: dict, key: str):
        hub = self.server_hub
        if key in hub.corrupt:
            mid = len(data) // 2
            data = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1 :]
        total = len(data)
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and (m := RANGE_RE.match(rng.strip())):
            start = int(m[1])
            end = int(m[2]) if m[2] else total - 1
            if start >= total:
                return self._send(416, b"", {"Content-Range": f"bytes */{total}"})
            data = data[start : end + 1]
            headers = {**headers, "Content-Range": f"bytes {start}-{start + len(data) - 1}/{total}"}
            status = 206
        headers = {**headers, "Content-Length": len(data)}
        limit = hub.cut.get(key)
        if limit is None or self.command == "HEAD":
            return self._send(status, data, headers, ctype="application/octet-stream")
        # The fault: announce everything, send ``limit`` bytes, drop the connection.
        self._record(status)
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.write(data[: max(0, limit - start)])
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(2)
        return None


def synthetic_model_files(model: str, shards: int, shard_mib: int) -> dict:
    """The simulated cluster's stand-in model (path -> bytes): a config, a tokenizer config, an index and
    ``shards`` weight files of ``shard_mib`` MiB each, their content derived from the model id so that
    every run serves the same bytes (and so the same blob names) without storing them."""
    files = {
        "config.json": json.dumps({"architectures": ["SparkopsSimForCausalLM"], "model_type": "sparkops-sim"}).encode(),
        "tokenizer_config.json": b'{"model_max_length": 4096}',
    }
    index: dict = {"weight_map": {}}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        block = (hashlib.sha256(f"{model}/{i}".encode()).digest() * 32768)[: 1 << 20]
        files[name] = block * shard_mib
        index["weight_map"][f"layer.{i}"] = name
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    return files


def main(argv: list | None = None) -> int:
    """Serve the stand-in model until killed: the simulated cluster's Hub (sim/simctl.py starts it on the
    management bridge, so the nodes download with the image's own huggingface_hub as they would from the Hub)."""
    import argparse  # noqa: PLC0415 - only the command line needs it
    import signal  # noqa: PLC0415

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--address", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument(
        "--cdn-port", type=int, required=True, help="the CDN's port on the same address (another host:port)"
    )
    ap.add_argument("--model", required=True)
    ap.add_argument("--commit", required=True, help="the 40-hex commit that main points to")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mib", type=int, default=8)
    args = ap.parse_args(argv)
    hub = HubServer(args.address, args.address, args.port, args.cdn_port)
    hub.add_repo(args.model, synthetic_model_files(args.model, args.shards, args.shard_mib), commit=args.commit)
    hub.echo = True
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with hub:
        print(f"hub_server: {args.model}@main={args.commit} at {hub.endpoint}", flush=True)
        while not stop.wait(3600):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
