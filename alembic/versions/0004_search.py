"""search: per-document-type exact statistics; search, hybrid, text, stats and context functions

Revision ID: 0004
Revises: 0003
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0004_search.sql")


def downgrade() -> None:
    revision_downgrade("0004_search.sql")
