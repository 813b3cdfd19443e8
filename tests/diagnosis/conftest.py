"""Fixtures of the diagnosis tests."""

import pytest

from bundled_rollouts import bundled_prompts


@pytest.fixture(scope="module")
def bundled():
    """(the bundled model, its prompts): built once per test module."""
    return bundled_prompts()
