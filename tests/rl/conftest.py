"""Fixtures of the rl tests."""

import pytest

from rla.rl.trainer import train
from toy_runs import toy_config


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    result = train(toy_config(out), log=None)
    return out, result
