"""Alembic environment: all logic lives in pgrag.migrate.run_env (shipped in the wheel)."""

from logging.config import fileConfig

from alembic import context
from pgrag.migrate import run_env

if context.config.config_file_name is not None:
    fileConfig(context.config.config_file_name, disable_existing_loggers=False)

run_env(context)
