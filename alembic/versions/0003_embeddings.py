"""embeddings: content cache, query cache, per-chunk failures; worker claim and store functions

Revision ID: 0003
Revises: 0002
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0003_embeddings.sql")


def downgrade() -> None:
    revision_downgrade("0003_embeddings.sql")
