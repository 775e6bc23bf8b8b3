"""text index: a chunk's tsvector written by pgrag (the worker after a commit-time render)

Revision ID: 0011
Revises: 0010
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0011_text_index.sql")


def downgrade() -> None:
    revision_downgrade("0011_text_index.sql")
