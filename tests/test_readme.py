"""The documentation's examples run as written: the Python API page's notebook (on the toy world), every command
README and docs/*.md show that needs no data of your own, and the local S3 walk-through."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
PAGES = [README, *sorted((README.parent / "docs").glob("*.md"))]  # the front door and every docs page


def _page_with(marker: str) -> str:
    """The text of the one page (README or docs/*.md) that holds ``marker``."""
    found = [p for p in PAGES if marker in p.read_text()]
    assert len(found) == 1, f"{marker!r} is on {[p.name for p in found]}, expected exactly one page"
    return found[0].read_text()


@pytest.mark.slow
def test_python_api_example_runs(tmp_path):
    text = _page_with("# Python API (a notebook")
    section = text[text.index("# Python API (a notebook"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env={"HARDRANK_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("{'image':")                      # the plan
    assert any(l.startswith("toy-clip_step0700 85.7") for l in lines), out.stdout  # the demo's figure
    assert sum("per-query outcomes" in l for l in lines) == 8    # 2 checkpoints x 4 toy suites read back


@pytest.mark.slow
def test_training_loop_example_runs(tmp_path):
    """The Python API page's training loop: open_clip's model object evaluated every 20 steps, no file written but
    the results and its fingerprinted store folders, the model still training after each evaluation."""
    text = _page_with("## Evaluating inside a training loop")
    section = text[text.index("## Evaluating inside a training loop"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env={"HARDRANK_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines()]
    assert [ln[0] for ln in lines] == ["20", "40"] and all(ln[2] == "True" for ln in lines), out.stdout
    assert all(0 <= float(ln[1]) <= 100 for ln in lines)
    results = tmp_path / "results" / "train"
    assert (results / "run1-step20" / "toy-rococo.json").is_file() and (results / "run1-step40").is_dir()
    folders = sorted(p.name for p in (results / "store").iterdir() if p.is_dir())
    assert [f.split("-fp32-")[0] for f in folders] == ["run1-step20", "run1-step40"], folders


# -- every command README, docs/*.md and --help show, that needs no data of your own, runs as written after the demo --
EXTERNAL = (" /data", "logs/", "a.pt", "ckpt/", ".toml", "data/rococo", "amodal/", "preds/", "~", "coco_karpathy", "s3://",
            "my_model", "b32.parquet", "finetuned/", "captions.json", "images/ ", "STORE/", "<", "$")


def _command_lines(text: str) -> list[str]:
    """`hardrank ...` commands of a shell snippet, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip().startswith("hardrank ")]


def _runnable(cmd: str) -> bool:
    """Needs nothing but what `hardrank demo --out results/demo` made (and the repository's files)."""
    return "results/demo" in cmd and not any(m in cmd for m in EXTERNAL)


def _help_examples() -> list[str]:
    from hardrank.jobs.cli import build_parser

    out, todo = [], [build_parser()]
    while todo:
        p = todo.pop(0)
        out.extend(_command_lines(p.epilog or ""))
        for a in p._actions:
            if a.__class__.__name__ == "_SubParsersAction":
                todo.extend(a.choices.values())
    return list(dict.fromkeys(out))


def _run(cmd: str, capsys) -> str:
    import glob
    import shlex

    from hardrank.jobs.cli import main

    argv = []
    for a in shlex.split(cmd, comments=True)[1:]:  # as a shell would: comments dropped, globs expanded
        argv.extend(sorted(glob.glob(a)) or [a] if "*" in a else [a])
    code = main(argv)
    out = capsys.readouterr()
    assert code == 0, f"`{cmd}` exited {code}:\n{out.err[-2000:]}"
    return out.out


@pytest.mark.slow
def test_readme_and_help_commands_run_as_written_after_the_demo(tmp_path, monkeypatch, capsys):
    from hardrank.toyworld import WorldConfig, build_world

    (tmp_path / "engine").symlink_to(README.parent / "engine")  # the repository's files, as in a clone
    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "cache"
    monkeypatch.setenv("HARDRANK_CACHE", str(cache))
    build_world("results/demo/toy_world", WorldConfig(n_train=10, n_test=24, n_inpaint=8))  # a small demo world
    demo = _run("hardrank demo --out results/demo --quiet", capsys)
    assert "where things are:" in demo and "store      results/demo/store" in demo
    suggested = [l.strip() for l in demo.splitlines() if l.startswith("  hardrank ")]
    assert len(suggested) == 3 and all(_runnable(c) for c in suggested)
    blocks = [b for p in PAGES for b in re.findall(r"```bash\n(.*?)```", p.read_text(), re.S)]
    readme = [c for b in blocks for c in _command_lines(b) if _runnable(c)]
    helps = [c for c in _help_examples() if _runnable(c) and not c.startswith("hardrank demo --out results/demo")]
    assert len(readme) >= 20 and len(helps) >= 8
    ran = set()
    for cmd in suggested + readme + helps:
        if cmd not in ran:
            ran.add(cmd)
            _run(cmd, capsys)
    # they reused the demo's store and world: nothing was built or embedded in the default cache
    assert not (cache / "toy_world").exists() and not (cache / "store").exists()
    assert (tmp_path / "results" / "demo" / "report" / "report.html").is_file()
    assert (tmp_path / "results" / "demo_mined" / "negclip.tsv").is_file()


def test_local_s3_example_runs_as_written_and_matches_the_folder(tmp_path, monkeypatch, capsys, s3):
    """The "Try it on this machine" block (docs/inputs.md), line by line: the server and the exports are the s3
    fixture's (a moto server on 127.0.0.1, on a free port), the rest runs as written; its last line prints
    True (the s3:// shards' metrics equal the folder's)."""
    from hardrank.toyworld import WorldConfig, build_world

    text = _page_with("**Try it on this machine**")
    block = re.search(r"\*\*Try it on this machine\*\*.*?```bash\n(.*?)```", text, re.S).group(1)
    lines = [line.strip() for line in re.sub(r"\\\n\s*", " ", block).splitlines() if line.strip()]
    assert lines[0].startswith("pip install") and lines[1].startswith("moto_server -H 127.0.0.1")
    assert lines[2].startswith("export ") and "AWS_ENDPOINT_URL=http://127.0.0.1:9000" in lines[2]
    (tmp_path / "engine").symlink_to(README.parent / "engine")
    monkeypatch.chdir(tmp_path)
    build_world("results/demo/toy_world", WorldConfig(n_train=10, n_test=30, n_inpaint=8))
    printed = []
    for line in lines[3:]:
        if line.startswith("hardrank "):
            _run(line, capsys)
        else:
            assert line.startswith("python -c ")
            import shlex

            argv = shlex.split(line, comments=True)
            res = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=300)  # the venv's
            assert res.returncode == 0, res.stderr[-2000:]
            printed.append(res.stdout.strip())
    assert printed[-1] == "True"
    assert any(p.endswith(".tar") for p in s3.find("toy/shards"))
