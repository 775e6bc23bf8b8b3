"""tuning: the ef_search measured for the store, in pgrag.settings; pgrag.tuning

Revision ID: 0010
Revises: 0009
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0010_tuning.sql")


def downgrade() -> None:
    revision_downgrade("0010_tuning.sql")
