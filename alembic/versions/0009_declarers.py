"""declared SQL runs as its declarer; the search hit's shape

Revision ID: 0009
Revises: 0008
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0009_declarers.sql")


def downgrade() -> None:
    revision_downgrade("0009_declarers.sql")
