"""What the tests that run the vLLM test double on loopback share: a free port and a Hugging Face cache
holding the tiny model the double is started with (each test module keeps its own module-scoped fixture
that calls tiny_hf_home, so that pytest finds the fixture where it is used)."""

from __future__ import annotations

import socket
from pathlib import Path

MODEL = "sparkops-org/tiny-model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_hf_home(home: Path) -> Path:
    repo = home / "hub" / ("models--" + MODEL.replace("/", "--"))
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    (snap / "config.json").write_text('{"model_type": "llama"}')
    (snap / "model.safetensors").write_bytes(b"\0" * 16)
    return home
