"""The route sweep of the gateway (real LiteLLM 1.108.7), shared by the loopback test (tests/unit/sim/
test_gateway_litellm.py, run from a LiteLLM venv) and the simulated cluster's (tests/integration/test_gateway.py,
against the gateway site.yml installed on the head).

The route list is the app's own, read in a process of its own by the gateway's Python: every operation of its
OpenAPI plus the routes it does not document (mounts, the UI, its static files). The proxy answers /openapi.json to
no key, so asking the running gateway for it would prove nothing."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GW_FILES = ROOT / "roles" / "gateway" / "files"

ROUTES = r"""
import json, os
from litellm.proxy.proxy_server import app
paths = {p: sorted(ops) for p, ops in app.openapi()["paths"].items()}
for route in app.routes:
    path = getattr(route, "path", None)
    if path and path not in paths:
        paths[path] = sorted(m.lower() for m in (getattr(route, "methods", None) or {"GET"}))
print(json.dumps(paths))
"""

# Paths no route table lists, asked besides: the root, the metrics mount, the UI, the docs, LiteLLM's liveness probe,
# and one that does not exist.
HIDDEN = ["/", "/metrics", "/metrics/", "/ui", "/ui/", "/docs", "/redoc", "/health/liveliness", "/nope"]


def operations(paths: dict) -> list[tuple[str, str]]:
    """(METHOD, path) for every operation, path parameters filled with a literal, plus the hidden paths."""
    tried = [(m.upper(), p.replace("{", "x").replace("}", "")) for p, ops in paths.items() for m in ops]
    ops = [(m, p) for m, p in tried if m in {"GET", "POST", "PUT", "PATCH", "DELETE"}]
    # Each once: paths that differ only in a parameter's name are the same request once filled in.
    return list(dict.fromkeys(ops + [("GET", p) for p in HIDDEN]))


def client_paths() -> set:
    """sparkops_gateway_auth.CLIENT_PATHS, read from its source (importing it here would import LiteLLM)."""
    tree = ast.parse((GW_FILES / "sparkops_gateway_auth.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "CLIENT_PATHS":
            return set(ast.literal_eval(node.value.args[0]))
    raise AssertionError("CLIENT_PATHS not found")


# Runs where the gateway is reached (stdlib only): argv[1] the base URL, argv[2] a file holding a JSON list of
# [method, path], argv[3] a file holding the key or "" for none. Prints {"METHOD path": status} for every operation.
SWEEP = r"""
import http.client, json, sys, urllib.parse
base = urllib.parse.urlsplit(sys.argv[1])
key = open(sys.argv[3]).read().strip() if sys.argv[3] else None
out = {}
conn = None
for method, path in json.load(open(sys.argv[2])):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    for attempt in (1, 2):  # one new connection if the server closed a kept-alive one
        try:
            conn = conn or http.client.HTTPConnection(base.hostname, base.port, timeout=30)
            conn.request(method, path, body=b"{}" if method != "GET" else None, headers=headers)
            resp = conn.getresponse()
            resp.read()
            out[method + " " + path] = resp.status
            if resp.will_close:
                conn.close(); conn = None
            break
        except (OSError, http.client.HTTPException) as exc:
            if conn:
                conn.close()
            conn = None
            out[method + " " + path] = str(exc)
print(json.dumps(out))
"""
