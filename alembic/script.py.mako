"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade(revision, "NNNN_name.sql")


def downgrade() -> None:
    revision_downgrade("NNNN_name.sql")
