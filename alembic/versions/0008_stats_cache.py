"""statistics cache: exact statistics reused while the tables they read are unchanged

Revision ID: 0008
Revises: 0007
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0008_stats_cache.sql")


def downgrade() -> None:
    revision_downgrade("0008_stats_cache.sql")
