"""The Python entry point: pgrag.connect() and the Client."""

from __future__ import annotations

import numpy as np
import pytest

import pgrag
from pgrag.errors import DimensionMismatch, NotMigrated


def test_public_api_is_explicit() -> None:
    for name in pgrag.__all__:
        assert hasattr(pgrag, name), name
    assert "connect" in pgrag.__all__ and "PgragError" in pgrag.__all__


def test_connect_registers_pgvector_on_every_connection(db_url: str) -> None:
    with pgrag.connect(db_url, min_size=2, max_size=2) as client:
        assert client.settings().embedding_dim == 384
        vec = np.arange(384, dtype=np.float32) / 384
        for _ in range(2):
            with client.connection() as conn:
                conn.execute(
                    "insert into pgrag.chunks (doc_type, source_key, text, embedding) "
                    "values ('t', %s, 'x', %s)",
                    (str(np.random.default_rng().integers(1 << 30)), vec),
                )
                row = conn.execute("select embedding from pgrag.chunks limit 1").fetchone()
                assert row is not None
                assert np.allclose(row[0].to_numpy(), vec)
        st = client.status()
        assert st.chunks == 2 and st.pending == 0 and st.doc_types == {"t": 2}
        client.check_dimension(384)
        with pytest.raises(DimensionMismatch, match="does not match this store's 384"):
            client.check_dimension(768)


def test_unmigrated_database_says_how_to_fix(empty_db_url: str) -> None:
    with pgrag.connect(empty_db_url) as client, pytest.raises(NotMigrated, match="db upgrade"):
        client.status()


def test_client_upgrade_then_use(empty_db_url: str) -> None:
    with pgrag.connect(empty_db_url) as client:
        client.upgrade()
        with client.connection() as conn:
            conn.execute(
                "insert into pgrag.chunks (doc_type, source_key, text, embedding) "
                "values ('t', '1', 'x', %s)",
                (np.ones(384, dtype=np.float32),),
            )
        assert client.status().chunks == 1
