"""hardrank report: leaderboard CSV, HTML/Markdown with embedded plots and worst failures, from fake results."""
import csv
import io
import re
import shutil
import subprocess

import pyarrow.parquet as pq
import pytest
from fake_results import CHECKPOINTS, make_fake_results

from hardrank.jobs.progress import make_progress
from hardrank.jobs.report import build_report, parse_step


@pytest.mark.parametrize("name, expected", [
    ("toy-clip_step0200", ("step", 200)),
    ("epoch_3", ("epoch", 3)),
    ("epoch-12", ("epoch", 12)),
    ("run2_epoch_3", ("epoch", 3)),
    ("ckpt_global_step1500", ("global_step", 1500)),
    ("iter1000", ("iter", 1000)),
    ("toy-clip-init", None),
    ("final", None),
    ("openai", None),
])
def test_parse_step(name, expected):
    assert parse_step(name) == expected


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake")
    results = make_fake_results(root / "results", world=root / "world")
    out = root / "report"
    return results, out, build_report(results, out, top=15)


def test_leaderboard_rows(fake):
    results, out, paths = fake
    rows = list(csv.DictReader(paths["csv"].open()))
    assert len(rows) == len(CHECKPOINTS) * 3
    assert [r["checkpoint"] for r in rows[::3]] == list(CHECKPOINTS)          # step order
    assert [r["step"] for r in rows[::3]] == ["0", "200", "400", "800"]
    assert [r["suite"] for r in rows[:3]] == ["toy-rococo", "toy-hard-positives", "toy-inpaint"]
    import json

    res = json.loads((results / CHECKPOINTS[-1] / "toy-rococo.json").read_text())
    last = rows[-3]
    assert last["main_metric"] == "R@1 mean"
    assert float(last["main"]) == pytest.approx(res["metrics"]["original"]["mean"]["R@1"], abs=1e-3)
    assert float(last["i2t:rand_voca FR"]) == pytest.approx(res["metrics"]["rand_voca"]["i2t"]["false_rate"], abs=1e-3)
    assert float(last["rsum"]) == pytest.approx(res["metrics"]["original"]["rsum"], abs=1e-3)
    hp = next(r for r in rows if r["suite"] == "toy-hard-positives" and r["checkpoint"] == CHECKPOINTS[0])
    hres = json.loads((results / CHECKPOINTS[0] / "toy-hard-positives.json").read_text())
    # replace (the aggregate) stands for its two members: main = mean(replace, swap)
    want = (hres["metrics"]["replace"]["all"]["augmented_accuracy"] + hres["metrics"]["swap"]["all"]["augmented_accuracy"]) / 2
    assert hp["main_metric"] == "augmented_accuracy" and float(hp["main"]) == pytest.approx(want, abs=1e-3)


def test_html_is_self_contained_with_plots_and_failures(fake):
    results, out, paths = fake
    page = paths["html"].read_text()
    assert page.count('<img class="plot"') == 3
    assert len(re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]{500,}"', page)) >= 3
    assert not re.search(r'(src|href)="(https?:|//|file:)', page)  # no external assets
    assert '<table class="failures">' in page
    assert 'class="thumb"' in page                                  # t2i top-1 images exist on disk
    # the failure count is that of the last checkpoint's Parquet: view != original, top-1 perturbed
    t = pq.read_table(results / CHECKPOINTS[-1] / "toy-rococo.parquet").to_pylist()
    n = sum(1 for r in t if r["kind"] == "ranking" and r["view"] != "original" and r["top1_group"] != "original")
    assert f"{n} queries whose top-1 is a perturbed item; showing 15" in page
    rows = re.findall(r"<tr><td>(i2t|t2i)</td><td>([^<]+)</td>", page)
    assert len(rows) == 15 and all(v != "original" for _, v in rows)
    assert "(same_concept)" in page or "(rand_voca)" in page or "patch_0.9_s1/val2014" in page
    for k in ("vs_step", "drops", "heatmap"):
        assert paths[f"plot_{k}"].read_bytes()[:4] == b"\x89PNG"


def test_markdown(fake):
    _, _, paths = fake
    md = paths["md"].read_text()
    assert "| checkpoint | toy-rococo | toy-hard-positives | toy-inpaint |" in md
    assert "![Per-variant drop](plots/drops.png)" in md
    assert "| task | view | query | top-1 (perturbed) |" in md


def test_name_order_and_duplicate_runs(tmp_path):
    make_fake_results(tmp_path / "res" / "runA", checkpoints=("final", "base"), n_images=6)
    make_fake_results(tmp_path / "res" / "runB", checkpoints=("final",), n_images=6)
    paths = build_report(tmp_path / "res")
    assert paths["html"].parent == tmp_path / "res" / "report"
    rows = list(csv.DictReader(paths["csv"].open()))
    assert "order" in rows[0] and "step" not in rows[0]
    assert sorted({r["checkpoint"] for r in rows}) == ["runA/base", "runA/final", "runB/final"]
    # a second report skips its own output folder and the results are unchanged
    again = build_report(tmp_path / "res")
    assert list(csv.DictReader(again["csv"].open())) == rows


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_report(tmp_path / "nope")
    (tmp_path / "empty" / "x").mkdir(parents=True)
    (tmp_path / "empty" / "x" / "manifest.json").write_text('{"dim": 4}')  # a store manifest is no result
    with pytest.raises(FileNotFoundError, match="no result files under"):
        build_report(tmp_path / "empty")
    from hardrank.jobs.cli import main

    assert main(["report", str(tmp_path / "nope")]) == 3


def test_report_cli(tmp_path, capsys):
    from hardrank.jobs.cli import main

    make_fake_results(tmp_path / "r", checkpoints=("a_epoch_1", "a_epoch_2"), n_images=5)
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "o"), "--top", "3"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "o" / f) for f in ("leaderboard.csv", "report.html", "report.md")]


def test_screenshot_in_headless_chromium(fake, tmp_path):
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    _, _, paths = fake
    shot = tmp_path / "report.png"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1400,2400",
                    paths["html"].resolve().as_uri()], check=True, capture_output=True, timeout=120)
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size == (1400, 2400)
        # a blank page is one colour; the rendered report has plots
        assert len(im.convert("RGB").resize((140, 240)).getcolors(1 << 16)) > 50
    print(f"screenshot: {shot}")


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_progress_modes():
    assert make_progress(quiet=True) is None
    s = _Stream(tty=False)
    bar = make_progress(stream=s, interval=0.0)(total=10, desc="embed images")
    bar.update(4)
    bar.close()
    lines = s.getvalue().splitlines()
    assert lines[0].startswith("embed images: 4/10 (40%)") and "item/s" in lines[0] and "ETA" in lines[0]
    assert lines[-1].endswith("done")
    t = _Stream(tty=True)
    bar = make_progress(stream=t)(total=3, desc="embed texts")
    assert type(bar).__name__ == "tqdm"
    bar.update(3)
    bar.close()
