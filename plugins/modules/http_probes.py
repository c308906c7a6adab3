#!/usr/bin/python
# Copyright: sparkops maintainers
# Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
---
module: http_probes
short_description: Send the same request to several URLs at once and say which answered and how
description:
  - Sends one HTTP request to each of I(urls), all at the same time, and returns for each whether a
    TCP connection was made to its host and port and the HTTP status it answered (C(-1) for none).
  - Made for questions whose expected answer is silence, such as "does this port answer without the
    API key from the management LAN?". A firewall that drops the packets makes each such request wait
    for its whole timeout; asked one after another, N dropped URLs cost N timeouts, asked at once one.
  - No API key or other credential is sent; the request carries only I(body). Read-only; never changes
    anything on the host it runs on or on the servers it asks (use it with requests that change
    nothing, or with servers that refuse them).
version_added: "0.1.0"
author:
  - sparkops maintainers (!UNKNOWN)
options:
  urls:
    description: The URLs to ask (C(http://) or C(https://)), each once. Duplicates are asked once.
    type: list
    elements: str
    required: true
  method:
    description: HTTP method of every request.
    type: str
    choices: [GET, POST]
    default: GET
  body:
    description: JSON body sent with every C(POST) (ignored for C(GET)).
    type: dict
  timeout_s:
    description: Seconds each URL may take, connection and answer together; all URLs are asked at once.
    type: float
    default: 5
  connect_timeout_s:
    description:
      - Seconds to wait for the TCP connection, within O(timeout_s). A port whose packets a firewall drops never
        answers; on a LAN an open or closed port answers in milliseconds, so waiting the whole O(timeout_s) for
        the connection says nothing more (a slow answer still gets the rest of O(timeout_s)).
    type: float
    default: 2
extends_documentation_fragment:
  - sparkops.cluster.attributes
attributes:
  check_mode:
    support: full
    details: Read-only; asks the same in check mode.
  diff_mode:
    support: none
    details: Changes nothing, so there is nothing to show.
notes:
  - An answer with an HTTP error status (4xx, 5xx) is an answer; its status is returned, not a failure.
"""

EXAMPLES = r"""
- name: Ask /tokenize without the key at the management and the fast-link addresses
  sparkops.cluster.http_probes:
    urls:
      - http://192.168.1.10:8000/tokenize
      - http://10.0.0.1:8000/tokenize
    method: POST
    body: {prompt: doctor, max_tokens: 1}
    timeout_s: 5
  register: keyless

- name: Fail when any of them answered with something other than 401
  ansible.builtin.assert:
    that: keyless.probes | rejectattr('status', 'in', [-1, 401]) | list | length == 0
"""

RETURN = r"""
probes:
  description: One entry per distinct URL, in the order of I(urls).
  returned: always
  type: list
  elements: dict
  contains:
    url:
      description: The URL asked.
      type: str
    connected:
      description: Whether a TCP connection to the URL's host and port was made.
      type: bool
    status:
      description: The HTTP status of the answer, or C(-1) when none came (refused, dropped, timed out, reset).
      type: int
    msg:
      description: What happened, for example C(HTTP 401) or C(timed out after 5.0 s).
      type: str
    elapsed_s:
      description: Seconds the request took.
      type: float
elapsed_s:
  description: Seconds all requests took together.
  returned: always
  type: float
"""

import http.client
import json
import ssl
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule


def url_problems(urls: list) -> list:
    out = []
    for url in urls:
        parts = urllib.parse.urlsplit(str(url))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            out.append(f"{url!r} is not an http:// or https:// URL with a host")
    return out


def probe(url: str, method: str, body: dict | None, timeout_s: float, connect_timeout_s: float = 2) -> dict:
    """Ask one URL; never raises. One connection: made (`connected`, within connect_timeout_s), then the request on
    it, both within timeout_s."""
    start = time.monotonic()
    out = {"url": url, "connected": False, "status": -1, "msg": ""}
    parts = urllib.parse.urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    # http.client, not urllib: no proxy from the environment, the request goes to the address named.
    conn = kind(parts.hostname, parts.port, timeout=min(timeout_s, connect_timeout_s))
    try:
        try:
            conn.connect()
        except ssl.SSLError as exc:  # the TCP connection was made; TLS failed on it
            out["connected"] = True
            out["msg"] = f"no answer: {exc}"
            return out
        except OSError as exc:
            out["msg"] = f"no connection: {exc}"
            return out
        out["connected"] = True
        conn.sock.settimeout(max(0.1, timeout_s - (time.monotonic() - start)))
        data = json.dumps(body).encode() if method == "POST" and body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request(method, path, body=data, headers=headers)
            out["status"] = int(conn.getresponse().status)
            out["msg"] = f"HTTP {out['status']}"
        except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, garbage instead of HTTP
            out["msg"] = f"no answer: {exc}"
    finally:
        conn.close()
        out["elapsed_s"] = round(time.monotonic() - start, 3)
    return out


def probe_all(
    urls: list, method: str = "GET", body: dict | None = None, timeout_s: float = 5, connect_timeout_s: float = 2
) -> list:
    """Every URL (each once, in order) asked at the same time."""
    unique = list(dict.fromkeys(str(u) for u in urls))
    if not unique:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(unique))) as pool:
        return list(pool.map(lambda u: probe(u, method, body, timeout_s, connect_timeout_s), unique))


def main():
    module = AnsibleModule(
        argument_spec={
            "urls": {"type": "list", "elements": "str", "required": True},
            "method": {"type": "str", "choices": ["GET", "POST"], "default": "GET"},
            "body": {"type": "dict"},
            "timeout_s": {"type": "float", "default": 5},
            "connect_timeout_s": {"type": "float", "default": 2},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems = url_problems(p["urls"])
    for name in ("timeout_s", "connect_timeout_s"):
        if p[name] <= 0:
            problems.append(f"{name} must be more than 0 seconds, not {p[name]}")
    if problems:
        module.fail_json(
            msg="Cannot ask these URLs: "
            + "; ".join(problems)
            + ". Give http(s) URLs and positive timeout_s and connect_timeout_s."
        )
    start = time.monotonic()
    probes = probe_all(p["urls"], p["method"], p["body"], p["timeout_s"], p["connect_timeout_s"])
    module.exit_json(changed=False, probes=probes, elapsed_s=round(time.monotonic() - start, 3))


if __name__ == "__main__":
    main()
