"""security: reader and writer roles, row-level security by tenant, sensitive columns

Revision ID: 0006
Revises: 0005
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0006_security.sql")


def downgrade() -> None:
    revision_downgrade("0006_security.sql")
