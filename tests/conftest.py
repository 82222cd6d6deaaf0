"""Shared fixtures: real RoCOCO annotation files, tiny random open_clip models, temp stores."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("HARDRANK_SHARED", ROOT.parent / "shared"))
ROCOCO_DIR = SHARED / "data" / "rococo"


@pytest.fixture(scope="session")
def rococo_dir() -> Path:
    if not (ROCOCO_DIR / "coco_karpathy_test.json").is_file():
        pytest.skip(f"real RoCOCO files not found at {ROCOCO_DIR} (set HARDRANK_SHARED)")
    return ROCOCO_DIR


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # never touch the user's ~/.cache from tests
    monkeypatch.setenv("HARDRANK_CACHE", str(tmp_path_factory.getbasetemp() / "hardrank-cache"))


def pytest_collection_modifyitems(config, items):
    # the long chaos loops run only when asked for (-m chaos); the default suite runs their short version
    if "chaos" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="long chaos loop: run with -m chaos")
    for item in items:
        if "chaos" in item.keywords:
            item.add_marker(skip)
