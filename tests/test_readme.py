"""The README's Python API example runs as written (on the toy world) and prints real numbers."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


@pytest.mark.slow
def test_python_api_example_runs(tmp_path):
    text = README.read_text()
    section = text[text.index("## Python API"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env={"HARDRANK_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("{'image':")                      # the plan
    assert any(l.startswith("toy-clip_step0700 85.7") for l in lines), out.stdout  # the demo's figure
    assert sum("per-query outcomes" in l for l in lines) == 6    # 2 checkpoints x 3 toy suites read back
