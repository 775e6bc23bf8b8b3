"""Test helpers for embeddings: a local OpenAI-compatible embeddings server, the real default
model loaded once per test process, and the ``pgrag`` CLI with the embedding commands."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from pgrag.embed.base import Vectors
from pgrag.embed.sentence_transformers import SentenceTransformerEmbedder

from .conftest import PATIENCE_S


def fake_vector(text: str, dim: int) -> Vectors:
    """The fake server's deterministic, unit-length vector for a text."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


@dataclass
class FakeEmbeddings:
    """POST /v1/embeddings as OpenAI answers it, on 127.0.0.1, in a thread.

    ``script`` holds (status, headers) answers to give before serving normally; ``always``
    answers every request with a status; texts containing ``poison`` get a 400; ``dim_override``
    returns vectors of the wrong size; while ``gate`` is set to an unset Event, requests wait
    for it (a test holds a batch at the embedder, then lets it go).
    """

    dim: int = 384
    script: deque[tuple[int, dict[str, str]]] = field(default_factory=deque)
    always: int | None = None
    poison: str | None = None
    dim_override: int | None = None
    gate: threading.Event | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(body)
                fake.started.set()
                if fake.gate is not None:
                    fake.gate.wait(PATIENCE_S)
                if not self.path.endswith("/embeddings"):
                    return self._answer(404, {"error": {"message": "no such route"}})
                if fake.script:
                    status, headers = fake.script.popleft()
                    return self._answer(
                        status, {"error": {"message": f"scripted {status}"}}, headers
                    )
                if fake.always is not None:
                    return self._answer(fake.always, {"error": {"message": "always failing"}})
                texts = body["input"]
                texts = [texts] if isinstance(texts, str) else texts
                if fake.poison and any(fake.poison in t for t in texts):
                    return self._answer(400, {"error": {"message": "input rejected"}})
                dim = fake.dim_override or body.get("dimensions") or fake.dim
                data = [
                    {"object": "embedding", "index": i, "embedding": fake_vector(t, dim).tolist()}
                    for i, t in enumerate(texts)
                ]
                data.reverse()  # indexes, not order, say which text a vector is for
                return self._answer(
                    200,
                    {
                        "object": "list",
                        "data": data,
                        "model": body["model"],
                        "usage": {"prompt_tokens": 1, "total_tokens": 1},
                    },
                )

            def _answer(
                self, status: int, payload: object, headers: dict[str, str] | None = None
            ) -> None:
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(raw)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def env(self, model: str = "fake-embed") -> dict[str, str]:
        return {
            "PGRAG_EMBEDDER": f"openai:{model}",
            "PGRAG_OPENAI_BASE_URL": self.base_url,
            "PGRAG_OPENAI_DIMENSIONS": str(self.dim),
        }


@functools.cache
def default_embedder() -> SentenceTransformerEmbedder:
    """The real default model (all-MiniLM-L6-v2, offline), loaded once per test process."""
    e = SentenceTransformerEmbedder()
    e.load()
    return e


class Recording:
    """Wraps a real embedder: serializes calls (one model, many threads) and records texts."""

    def __init__(self, inner: Any, before: Any = None) -> None:
        self.inner = inner
        self.texts: list[str] = []
        self.calls = 0
        self.before = before
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return str(self.inner.name)

    @property
    def dimension(self) -> int:
        return int(self.inner.dimension)

    def embed(self, texts: Sequence[str]) -> Vectors:
        with self._lock:
            self.calls += 1
            if self.before is not None:
                self.before(self.calls, texts)
            self.texts.extend(texts)
            out: Vectors = self.inner.embed(texts)
            return out


CLI_CODE = """
from pgrag.cli import cli, main
from pgrag.cli.embed import COMMANDS
for command in COMMANDS:
    if command.name not in cli.commands:
        cli.add_command(command)
main()
"""


def cli_env(db_url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGRAG_")}
    env.update({"PGRAG_DATABASE_URL": db_url, "HF_HUB_OFFLINE": "1"})
    env.update(extra or {})
    return env


def start_cli(args: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``pgrag ARGS`` (with the embedding commands registered) as a child process."""
    return subprocess.Popen(
        [sys.executable, "-c", CLI_CODE, *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_cli(
    args: Sequence[str], env: dict[str, str], timeout: float = PATIENCE_S
) -> subprocess.CompletedProcess[str]:
    proc = start_cli(args, env)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_until(predicate: Any, timeout: float = PATIENCE_S, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(every)


def texts(n: int, prefix: str = "chunk") -> Iterator[str]:
    topics = ["garden hoses", "winter boots", "espresso machines", "road bikes", "desk lamps"]
    for i in range(n):
        yield (
            f"{prefix} {i}: customer {i * 7 % 1000} bought {topics[i % 5]} in order {i}, "
            f"paid {i % 97}.50 EUR, and wrote that the {topics[(i + 2) % 5]} arrived late."
        )
