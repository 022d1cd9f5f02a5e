"""Benchmarks that print ratios against a baseline measured in the same run (see README.md).
Each is run from the repository root as a module, e.g. ``python -m bench.ledger``, so that it
imports the project's packages and the test helpers (``tests.pg``, ``tests.s3``) as they are."""
