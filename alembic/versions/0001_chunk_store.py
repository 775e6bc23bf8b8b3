"""chunk store: extension vector, schema pgrag, pgrag.settings, pgrag.chunks and indexes

Revision ID: 0001
Revises:
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0001_chunk_store.sql")


def downgrade() -> None:
    revision_downgrade("0001_chunk_store.sql")
