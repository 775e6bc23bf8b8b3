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


def test_compose_file_gives_hnsw_builds_shared_memory_and_buffers() -> None:
    compose = (REPO / "docker-compose.yml").read_text()
    mb = {"m": 1, "g": 1024}
    shm = re.search(r"^\s*shm_size:\s*(\d+)([mg])b?\s*$", compose, re.M | re.I)
    work = re.search(r"maintenance_work_mem=(\d+)([MG])B", compose)
    assert shm and work, "docker-compose.yml sets shm_size and maintenance_work_mem"
    # Docker's default 64 MB /dev/shm breaks parallel HNSW builds (pgvector issue 453)
    assert int(shm[1]) * mb[shm[2].lower()] > int(work[1]) * mb[work[2].lower()]
    assert "shared_buffers=1GB" in compose


def test_mypy_checks_the_tests_and_benchmarks_too() -> None:
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True and set(config["files"]) == {"pgrag", "tests", "bench"}
