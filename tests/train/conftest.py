"""What the train tests share: a small deterministic training text."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> str:
    """A small deterministic text file: test_loop.py's bytes repeated to 64 KiB."""
    path = tmp_path_factory.mktemp("data") / "text.txt"
    raw = (Path(__file__).parent / "test_loop.py").read_bytes()
    path.write_bytes((raw * (1 + (1 << 16) // len(raw)))[:1 << 16])
    return str(path)
