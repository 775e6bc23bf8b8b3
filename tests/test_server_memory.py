"""The embedded server's memory follows its data: shared_buffers starts small and grows, at a
start, to hold the HNSW indexes; huge pages are suggested only for a large index."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest

from pgrag.server import EmbeddedServer, wanted_shared_buffers_mb


def shared_buffers(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("show shared_buffers").fetchone()
    assert row is not None
    return str(row[0])


def test_shared_buffers_fit_the_index_within_the_memory_ceiling() -> None:
    assert wanted_shared_buffers_mb(0, 24_000) == 128  # PostgreSQL's default for no index
    assert wanted_shared_buffers_mb(50, 24_000) == 128  # a demo's 2,326 chunks: 4 MB
    assert wanted_shared_buffers_mb(100, 24_000) == 256
    assert wanted_shared_buffers_mb(2_000, 24_000) == 4_096  # 1,000,000 chunks
    assert wanted_shared_buffers_mb(2_000, 4_096) == 1_024  # a quarter of memory at most
    assert wanted_shared_buffers_mb(20_000, 1_000_000) == 8_192  # and 8GB


def test_a_new_server_is_small_and_grows_at_a_start_when_its_index_outgrew_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = EmbeddedServer(tmp_path / "data")
    try:
        url = server.start()
        assert shared_buffers(url) == "128MB"  # not a quarter of the machine for an empty store
        assert server.huge_pages_hint(url) is None  # no index: no sysctl advice
        assert server.memory_hint(url) is None
        # the server runs on 16MB (as if its index had grown past what it was sized for)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("alter system set shared_buffers = '16MB'")
        server.stop()
        url = server._pg_ctl_start_ready()
        assert shared_buffers(url) == "16MB"
        hint = server.memory_hint(url)
        assert hint is not None and "grows it to 128MB" in hint, hint
        server.stop()
        with caplog.at_level(logging.WARNING, logger="pgrag.server"):
            url = server.start()  # grows it, restarting before anyone connects
        assert shared_buffers(url) == "128MB"
        assert "shared_buffers grown from 16MB to 128MB" in caplog.text, caplog.text
        assert server.memory_hint(url) is None
        server.stop()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="pgrag.server"):
            url = server.start()  # sized: nothing to say
        assert caplog.text == "" and shared_buffers(url) == "128MB"
    finally:
        server.stop()


def test_a_size_the_server_cannot_start_with_leaves_it_running_as_it_was(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgrag import server as server_module

    server = EmbeddedServer(tmp_path / "data")
    try:
        server.start()
        server.stop()
        # more memory than the machine has: PostgreSQL refuses to start with it
        monkeypatch.setattr(server_module, "wanted_shared_buffers_mb", lambda *_: 1_000_000)
        with caplog.at_level(logging.WARNING, logger="pgrag.server"):
            url = server.start()
        assert shared_buffers(url) == "128MB"  # running, with the size it had
        assert "did not start with shared_buffers 1000000MB" in caplog.text, caplog.text
        assert "1000000" not in (tmp_path / "data" / "postgresql.auto.conf").read_text()
        monkeypatch.undo()
        server.stop()
        assert shared_buffers(server.start()) == "128MB"  # and it starts again by itself
    finally:
        server.stop()
