"""documents: pgrag.doc_types, pgrag.doc_watches, chunks.parent_key; declare/refresh/verify

Revision ID: 0002
Revises: 0001
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0002_documents.sql")


def downgrade() -> None:
    revision_downgrade("0002_documents.sql")
