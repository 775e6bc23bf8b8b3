"""sync at commit: statement triggers queue document keys; one deferred trigger renders them

Revision ID: 0007
Revises: 0006
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0007_sync_at_commit.sql")


def downgrade() -> None:
    revision_downgrade("0007_sync_at_commit.sql")
