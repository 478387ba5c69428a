"""Fixtures of the rl/ tests."""

import jax
import pytest


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield
