"""A local OpenAI-compatible chat completions endpoint for tests (stdlib only, one thread).

    with ChatServer([Reply(content='{"filter": {}}')]) as server:
        client = openai.OpenAI(base_url=server.url, api_key="k")
        ...
        server.requests[0]["body"]["messages"]

Replies are served in order; the last one repeats. A callable computes each reply from the
request body instead.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Reply:
    content: str | None = None  # the assistant message, for status 200
    status: int = 200
    error: str = "fake error"
    headers: dict[str, str] = field(default_factory=dict)
    model: str = "fake-model"


class ChatServer:
    def __init__(self, replies: Sequence[Reply] | Callable[[dict[str, Any]], Reply]) -> None:
        self.replies = replies
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"unparsable": raw.decode("utf-8", "replace")}
                headers = {k.lower(): v for k, v in self.headers.items()}
                reply = owner._record(self.path, headers, body)
                if not self.path.endswith("/chat/completions"):
                    reply = Reply(status=404, error="no such route " + self.path)
                if reply.status == 200:
                    payload: dict[str, Any] = {
                        "id": "chatcmpl-test",
                        "object": "chat.completion",
                        "created": 0,
                        "model": reply.model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": reply.content},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    }
                else:
                    payload = {
                        "error": {"message": reply.error, "type": "test_error", "code": None}
                    }
                data = json.dumps(payload).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return "http://" + str(host) + ":" + str(port) + "/v1"

    def _record(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        with self._lock:
            index = len(self.requests)
            self.requests.append({"path": path, "headers": headers, "body": body})
        if callable(self.replies):
            return self.replies(body)
        return self.replies[min(index, len(self.replies) - 1)]

    def __enter__(self) -> ChatServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def unused_port_url() -> str:
    """A URL where nothing listens (the port was just free)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return "http://127.0.0.1:" + str(port) + "/v1"
