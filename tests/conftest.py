"""Shared fixtures: paths to the repository, its scenarios and the shared reference data."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def conv_trace() -> Path:
    path = SHARED / "traces" / "splitwise_conv.csv"
    if not path.is_file():
        pytest.skip("../shared/traces is not beside the checkout")
    return path
