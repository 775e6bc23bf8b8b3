"""eval runs: stored evaluation results, to track retrieval quality over time

Revision ID: 0005
Revises: 0004
"""

from pgrag.migrate import revision_downgrade, revision_upgrade

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    revision_upgrade("0005_eval_runs.sql")


def downgrade() -> None:
    revision_downgrade("0005_eval_runs.sql")
