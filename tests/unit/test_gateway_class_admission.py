"""Batch keys yield to interactive ones in the gateway's ASGI wrapper (roles/gateway/files/sparkops_gateway_auth.py,
ClassAdmission): a batch request is refused at once while interactive requests are served and for a quiet time
after, and an interactive request that arrives stops the batch streams in flight the way a client that went away
does (http.disconnect on receive, which Starlette's StreamingResponse listens for), so vLLM frees their seats."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))  # `import gateway_keys`, as installed beside it
_spec = importlib.util.spec_from_file_location(
    "sparkops_gateway_auth_admission", ROOT / "roles" / "gateway" / "files" / "sparkops_gateway_auth.py"
)
auth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(auth)

ENTRIES = {"sk-inter": ("alice", "interactive"), "sk-batch": ("bulk", "batch")}


class Store:
    def __init__(self):
        self.refused = []

    def entry_for(self, key):
        found = ENTRIES.get(key)
        return None if found is None else {"name": found[0], "key_class": found[1]}

    def add_refusal(self, name):
        self.refused.append(name)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def scope(key, path="/v1/chat/completions"):
    return {"type": "http", "path": path, "headers": [(b"authorization", f"Bearer {key}".encode())]}


async def streaming_app(scope, receive, send, *, chunks=20, pace=0.01, log=None):
    """LiteLLM's stream as Starlette 1.10 runs it under ASGI 2.3 (starlette/responses.py:247-285): the body is read,
    then the stream runs beside a wait for http.disconnect, which cancels it."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})

    async def stream():
        for i in range(chunks):
            await send({"type": "http.response.body", "body": f"data: {i}\n\n".encode(), "more_body": True})
            await asyncio.sleep(pace)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    async def listen():
        while (await receive())["type"] != "http.disconnect":
            pass

    streaming, listening = asyncio.ensure_future(stream()), asyncio.ensure_future(listen())
    done, _pending = await asyncio.wait({streaming, listening}, return_when=asyncio.FIRST_COMPLETED)
    for task in (streaming, listening):
        task.cancel()
    if log is not None:
        log.append("cancelled" if listening in done else "finished")


def client():
    """receive: the request's body once, then nothing until the connection closes (as uvicorn)."""
    sent, closed = [], asyncio.Event()
    first = [True]

    async def receive():
        if first[0]:
            first[0] = False
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await closed.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    return receive, send, sent


def body(sent) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_the_admission_counts_interactive_requests_and_a_quiet_time_after_them():
    clock = Clock()
    adm = auth.ClassAdmission(quiet_s=5, clock=clock)
    assert adm.batch_wait() == 0
    adm.interactive_begins()
    assert adm.batch_wait() == 5
    clock.now += 30
    assert adm.batch_wait() == 5, "while an interactive request is in flight, however long"
    adm.interactive_ends()
    clock.now += 2
    assert adm.batch_wait() == 3
    clock.now += 3
    assert adm.batch_wait() == 0


def test_an_interactive_request_stops_every_batch_request_in_flight_once():
    async def main():
        adm = auth.ClassAdmission(quiet_s=5)
        one, two = adm.batch_begins(), adm.batch_begins()
        adm.batch_ends(two)
        (ended,) = adm.interactive_begins()
        assert one.is_set() and not two.is_set() and not ended.is_set()
        assert adm.interactive_begins() == [], "already stopped"
        adm.batch_ends(one)
        assert ended.is_set()
        await asyncio.wait_for(adm.released([ended]), 0.1)

    asyncio.run(main())


def test_a_batch_request_while_an_interactive_one_streams_gets_429_at_once_and_never_reaches_litellm():
    store, reached = Store(), []

    async def inner(scope_, receive, send):
        key = dict(scope_["headers"])[b"authorization"]
        reached.append(key)
        await streaming_app(scope_, receive, send)

    async def main():
        wrapper = auth.RequireKeyEverywhere(inner, store, metrics_keys=frozenset(), admission=auth.ClassAdmission(5))
        i_recv, i_send, _i_sent = client()
        b_recv, b_send, b_sent = client()
        interactive = asyncio.ensure_future(wrapper(scope("sk-inter"), i_recv, i_send))
        await asyncio.sleep(0.03)
        await wrapper(scope("sk-batch"), b_recv, b_send)
        await interactive
        await asyncio.gather(*auth._PENDING)
        return b_sent

    b_sent = asyncio.run(main())
    assert b_sent[0]["status"] == 429 and (b"retry-after", b"5") in b_sent[0]["headers"]
    assert b"interactive requests are being served" in body(b_sent)
    assert reached == [b"Bearer sk-inter"], "the batch request never reached LiteLLM"
    assert store.refused == ["bulk"]


def test_an_interactive_request_stops_a_batch_stream_waits_for_it_to_end_and_is_served_alone():
    store, log = Store(), []

    async def inner(scope_, receive, send):
        batch = dict(scope_["headers"])[b"authorization"] == b"Bearer sk-batch"
        if not batch:
            log.append("interactive starts")
        await streaming_app(scope_, receive, send, chunks=50 if batch else 5, log=log if batch else None)

    async def main():
        adm = auth.ClassAdmission(5)
        wrapper = auth.RequireKeyEverywhere(inner, store, metrics_keys=frozenset(), admission=adm)
        b_recv, b_send, b_sent = client()
        i_recv, i_send, i_sent = client()
        batch = asyncio.ensure_future(wrapper(scope("sk-batch"), b_recv, b_send))
        await asyncio.sleep(0.05)
        await wrapper(scope("sk-inter"), i_recv, i_send)
        await asyncio.wait_for(batch, 2)
        await asyncio.gather(*auth._PENDING)
        return b_sent, i_sent, adm

    b_sent, i_sent, adm = asyncio.run(main())
    assert log == ["cancelled", "interactive starts"], "the stopped stream ended before the interactive one began"
    got = body(b_sent)
    assert got.startswith(b"data: 0\n\n") and b"[DONE]" not in got
    last = got.rstrip().rsplit(b"\n\n", maxsplit=1)[-1]
    error = json.loads(last.removeprefix(b"data: "))["error"]
    assert error["code"] == 429 and "stopped for an interactive request" in error["message"]
    assert b_sent[-1].get("more_body", False) is False, "the batch client's answer ends"
    assert body(i_sent).endswith(b"data: [DONE]\n\n"), "the interactive answer is whole"
    assert store.refused == ["bulk"]
    assert adm.interactive == 0 and not adm._batch


def test_an_interactive_request_waits_at_most_a_second_for_a_batch_request_that_does_not_end():
    async def main():
        adm = auth.ClassAdmission(5)
        adm.batch_begins()
        t0 = asyncio.get_running_loop().time()
        await adm.released(adm.interactive_begins())
        return asyncio.get_running_loop().time() - t0

    assert 0.9 < asyncio.run(main()) < 1.5


def test_a_batch_request_after_the_quiet_time_is_served_and_interactive_ones_are_never_held():
    clock, store = Clock(), Store()

    async def inner(scope_, receive, send):
        await streaming_app(scope_, receive, send, chunks=2, pace=0)

    async def serve(wrapper, key, path="/v1/chat/completions"):
        receive, send, sent = client()
        await wrapper(scope(key, path), receive, send)
        return sent

    async def main():
        wrapper = auth.RequireKeyEverywhere(
            inner, store, metrics_keys=frozenset(), admission=auth.ClassAdmission(5, clock)
        )
        first = await serve(wrapper, "sk-inter")
        clock.now += 4
        early = await serve(wrapper, "sk-batch")
        models = await serve(wrapper, "sk-batch", "/v1/models")
        again = await serve(wrapper, "sk-inter")
        clock.now += 5.5
        late = await serve(wrapper, "sk-batch")
        await asyncio.gather(*auth._PENDING)
        return first, early, models, again, late

    first, early, models, again, late = asyncio.run(main())
    assert first[0]["status"] == 200 and again[0]["status"] == 200
    assert early[0]["status"] == 429 and (b"retry-after", b"1") in early[0]["headers"]
    assert models[0]["status"] == 200, "the model list is no generation: never held"
    assert late[0]["status"] == 200 and body(late).endswith(b"[DONE]\n\n")


def test_the_quiet_time_comes_from_the_environment_and_a_bad_value_keeps_the_default():
    assert auth.batch_quiet_s({auth.BATCH_QUIET_ENV: "2.5"}) == 2.5
    assert auth.batch_quiet_s({auth.BATCH_QUIET_ENV: "0"}) == 0
    assert auth.batch_quiet_s({auth.BATCH_QUIET_ENV: "soon"}) == auth.BATCH_QUIET_S
    assert auth.batch_quiet_s({}) == auth.BATCH_QUIET_S
