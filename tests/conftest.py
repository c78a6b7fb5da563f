"""Shared fixtures. Tests mirror modules: tests/test_<module>.py."""

from __future__ import annotations

import pathlib

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def gen() -> torch.Generator:
    """A fresh seeded generator for each test."""
    return torch.Generator().manual_seed(0)
