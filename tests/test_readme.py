"""The README's first screen and CI stay in step."""

from __future__ import annotations

import re

from .conftest import REPO


def commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    return re.findall(r"```sh\n(python3 -m venv .*)\n```", readme)


def test_readme_gives_two_setup_commands_first() -> None:
    demo, tests = commands()[:2]
    assert demo.endswith("pgrag demo")
    assert tests.endswith("pytest")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    assert commands()[1] in ci.splitlines()


def test_compose_file_has_a_healthchecked_pgvector_db() -> None:
    compose = (REPO / "docker-compose.yml").read_text()
    assert "image: pgvector/pgvector:pg17" in compose
    assert "healthcheck:" in compose and "pgrag-data:" in compose
