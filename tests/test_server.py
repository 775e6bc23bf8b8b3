"""The embedded server: cold start, reuse, concurrent starts, and the directories it refuses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from pgrag.errors import ServerError
from pgrag.server import EmbeddedServer, memory_mb, shared_buffers_mb

from .conftest import PATIENCE_S


def test_cold_start_then_reuse(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "data")
    try:
        url = server.start()
        pid = server.status().pid
        assert server.ensure() == url  # warm reuse: same server, no restart
        assert server.start() == url
        assert server.status().pid == pid
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "select current_database(), "
                "(select count(*) from pg_available_extensions where name = 'vector')"
            ).fetchone()
        assert row == ("pgrag", 1)
        st = server.status()
        assert st.running and st.initialized and st.version == "18"
    finally:
        assert server.stop() is True
    assert server.stop() is False
    assert not server.status().running
    # a stopped server starts again on the same data; without huge pages, it says how to get
    # them when shared_buffers is large (a quarter of memory: 6 GB on these machines), unless
    # they were turned off on purpose
    try:
        url = server.start()
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "select current_setting('huge_pages_status'), "
                "pg_size_bytes(current_setting('shared_buffers')) >= 1024 * 1024 * 1024, "
                "current_setting('shared_memory_size_in_huge_pages')::integer"
            ).fetchone()
        assert row is not None
        hint = server.huge_pages_hint(url)
        if row[0] == "off" and row[1] and row[2] > 0:  # the machine reserves none
            assert hint is not None and f"sysctl -w vm.nr_hugepages={row[2]}" in hint
        else:
            assert hint is None
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("alter system set huge_pages = off")
        server.stop()
        url = server.start()
        assert server.huge_pages_hint(url) is None
    finally:
        server.stop()


def test_two_processes_starting_at_once_share_one_server(tmp_path: Path) -> None:
    data = tmp_path / "data"
    code = (
        "import sys, pgrag; from pgrag.server import EmbeddedServer;"
        "c = pgrag.connect(embedded=True);"
        "cm = c.connection(); conn = cm.__enter__();"
        "r = conn.execute('select pg_postmaster_start_time()').fetchone();"
        "print(EmbeddedServer().status().pid, r[0]); cm.__exit__(None, None, None); c.close()"
    )
    env = {"PGRAG_DATA_DIR": str(data), "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        outs = [p.communicate(timeout=PATIENCE_S) for p in procs]  # a hang guard
        for p, (_, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err
        assert outs[0][0] == outs[1][0]  # same postmaster pid, same start time
    finally:
        EmbeddedServer(data).stop()


def test_refuses_a_cluster_of_another_version(tmp_path: Path) -> None:
    data = tmp_path / "old"
    data.mkdir()
    (data / "PG_VERSION").write_text("16\n")
    with pytest.raises(ServerError, match="holds a PostgreSQL 16 cluster.*PGRAG_DATA_DIR"):
        EmbeddedServer(data).start()


def test_refuses_a_non_empty_directory_that_is_no_cluster(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ServerError, match="not empty and holds no PostgreSQL cluster"):
        EmbeddedServer(tmp_path).start()


def test_refuses_an_unwritable_directory() -> None:
    with pytest.raises(ServerError, match="cannot be created.*PGRAG_DATA_DIR"):
        EmbeddedServer(Path("/proc/pgrag-cannot-write-here")).start()


def test_a_long_data_dir_puts_its_socket_in_a_private_directory(tmp_path: Path) -> None:
    import stat

    from pgrag.server import socket_dir

    data = tmp_path / ("d" * 100)
    server = EmbeddedServer(data)
    try:
        server.start()
        sock = socket_dir(data)
        assert sock != data
        assert stat.S_IMODE(sock.stat().st_mode) == 0o700
        with psycopg.connect(server.ensure()) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    finally:
        server.stop()


def test_shared_buffers_follow_the_memory_a_container_may_use(tmp_path: Path) -> None:
    host = memory_mb(())
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    v2.write_text("max\n")
    v1.write_text(f"{2**63 - 4096}\n")  # cgroup v1's "no limit"
    assert memory_mb((v2, v1, tmp_path / "missing")) == host
    v2.write_text(f"{2 * 2**30}\n")  # a 2 GB container on a larger host
    assert memory_mb((v2,)) == min(host, 2048)
    assert shared_buffers_mb(2048) == 512
    assert shared_buffers_mb(256) == 128 and shared_buffers_mb(64 * 1024) == 8192
