"""Fixtures for end-to-end tests (see harness.py)."""

from tests.e2e.harness import cluster, job_name, repo_factory

__all__ = ["cluster", "job_name", "repo_factory"]
