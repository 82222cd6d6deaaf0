"""hardrank report: leaderboard CSV, HTML/Markdown with embedded plots and worst failures, from real results."""
import csv
import html
import io
import json
import logging
import re
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_karpathy_world

from hardrank import evaluate
from hardrank.errors import DataError, MissingExtra
from hardrank.jobs.progress import make_progress
from hardrank.jobs.report import build_report, parse_step, plot_bench

CHECKPOINTS = ("toy-clip_step0000", "toy-clip_step0200", "toy-clip_step0400", "toy-clip_step0800")
SUITES = ("rococo", "hard_positives")
TEXT_VARIANTS = ("same_concept", "rand_voca")
IMAGE_VARIANTS = ("mix_0.9", "patch_0.9")
HARD_POSITIVE_FILES = ("vl_checklist_attributes", "vl_checklist_relations", "visual_genome_attribution")


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


def _write_hard_positives(ann, clean) -> dict[str, tuple[int, str]]:
    """Hard-positive files (data/ and swapped_data/) next to the Karpathy file, one triplet per image:
    c, c_P (the swapped file's true caption) and c_N. Returns {caption: (image, "pos"|"neg")}."""
    roles = {}
    for sub in ("data", "swapped_data"):
        (ann / sub).mkdir()
    for k, stem in enumerate(HARD_POSITIVE_FILES):
        orig, swap = [], []
        for i, item in enumerate(clean):
            cap = item["caption"][k]
            triplet = {"image_path": item["image"], "true_caption": cap, "false_caption": f"{cap[:-1]}, upside down."}
            if stem == "visual_genome_attribution":  # SWAP items are cropped to their box
                triplet.update(bbox_x=0, bbox_y=0, bbox_w=20, bbox_h=15)
            orig.append(triplet)
            swap.append({**triplet, "true_caption": f"Indeed: {cap}"})
            roles.update({triplet["false_caption"]: (i, "neg"), swap[-1]["true_caption"]: (i, "pos")})
        (ann / "data" / f"{stem}.json").write_text(json.dumps(orig))
        (ann / "swapped_data" / f"{stem}.json").write_text(json.dumps(swap))
    return roles


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny RoCOCO world (2 caption variants, 2 altered galleries) plus hard-positive files, and the
    role of every image and caption id: (the image it shows or describes, "pos" or "neg")."""
    root = tmp_path_factory.mktemp("world")
    w = make_karpathy_world(root, n_images=12, variants=TEXT_VARIANTS,
                            image_variants=tuple(f"{v}_s1" for v in IMAGE_VARIANTS))
    clean, ann = w["clean"], w["annotations"]
    images = {it["image"]: (i, "pos") for i, it in enumerate(clean)}
    images.update({f"{v}_s1/{it['image']}": (i, "neg") for i, it in enumerate(clean) for v in IMAGE_VARIANTS})
    texts = {c: (i, "pos") for i, it in enumerate(clean) for c in it["caption"]}
    perturbed = set()
    for v in TEXT_VARIANTS:
        for i, item in enumerate(json.loads((ann / f"{v}.json").read_text())):
            for c in item["caption"][len(clean[i]["caption"]):]:
                texts.setdefault(c, (i, "neg"))  # a perturbed caption equal to its original stays positive
                perturbed.add(c)
    for c, role in _write_hard_positives(ann, clean).items():
        texts.setdefault(c, role)
    return {**w, "roles": {"image": images, "text": texts}, "perturbed_texts": perturbed}


def _eval(world, out, checkpoints, tmp) -> None:
    """Results of ``hardrank eval --embeddings`` for each checkpoint (named by its embeddings file). The
    embeddings improve with the checkpoint's position: positives move towards their image's concept,
    perturbed items (altered images, perturbed and false captions) stay half-way there."""
    concepts = np.random.default_rng(1234).normal(size=(len(world["clean"]), 32))
    concepts /= np.linalg.norm(concepts, axis=1, keepdims=True)
    for k, ckpt in enumerate(checkpoints):
        skill = 0.25 + 0.25 * k / max(len(checkpoints) - 1, 1)
        rng = np.random.default_rng(k)
        kinds, ids, embs = [], [], []
        for kind, roles in world["roles"].items():
            for id_, (i, role) in roles.items():
                w = skill if role == "pos" else 0.5
                kinds.append(kind)
                ids.append(id_)
                embs.append((w * concepts[i] + (1 - w) * rng.normal(size=32) / np.sqrt(32)).tolist())
        path = tmp / "embeddings" / f"{ckpt}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"kind": kinds, "id": ids, "embedding": embs}), path)
        evaluate(embeddings=str(path), suites=list(SUITES), annotations=str(world["annotations"]),
                 data=str(world["annotations"]), images=str(world["images"]), image_variants=list(IMAGE_VARIANTS),
                 seeds=[1], out=str(out), store=str(tmp / "store"), device="cpu")


@pytest.fixture(scope="module")
def report(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    _eval(world, root / "results", CHECKPOINTS, root)
    return root / "results", build_report(root / "results", root / "report", top=15)


def test_leaderboard_rows(report):
    results, paths = report
    rows = list(csv.DictReader(paths["csv"].open()))
    assert len(rows) == len(CHECKPOINTS) * len(SUITES)
    assert [r["checkpoint"] for r in rows[::2]] == list(CHECKPOINTS)          # step order
    assert [r["step"] for r in rows[::2]] == ["0", "200", "400", "800"]
    assert [r["suite"] for r in rows[:2]] == ["rococo", "hard_positives"]   # ranking suites first
    assert list(rows[0])[-4:] == ["model_fingerprint", "tie_rule", "failed_items", "result"]
    res = json.loads((results / CHECKPOINTS[-1] / "rococo.json").read_text())
    last = rows[-2]
    assert last["main_metric"] == "R@1 mean"
    assert float(last["main"]) == pytest.approx(res["metrics"]["original"]["mean"]["R@1"], abs=1e-3)
    assert float(last["i2t:rand_voca FR"]) == pytest.approx(res["metrics"]["rand_voca"]["i2t"]["false_rate"],
                                                            abs=1e-3)
    assert float(last["t2i:mix_0.9_s1 R@1"]) == pytest.approx(res["metrics"]["mix_0.9_s1"]["t2i"]["R@1"], abs=1e-3)
    assert float(last["rsum"]) == pytest.approx(res["metrics"]["original"]["rsum"], abs=1e-3)
    assert last["result"] == (results / CHECKPOINTS[-1] / "rococo.json").as_posix()
    assert float(last["main"]) > float(rows[0]["main"])                      # the checkpoints get better
    hp = next(r for r in rows if r["suite"] == "hard_positives" and r["checkpoint"] == CHECKPOINTS[0])
    hm = json.loads((results / CHECKPOINTS[0] / "hard_positives.json").read_text())["metrics"]
    # replace (the aggregate) stands for its two members: main = mean(replace, swap)
    want = (hm["replace"]["all"]["augmented_accuracy"] + hm["swap"]["all"]["augmented_accuracy"]) / 2
    assert hp["main_metric"] == "augmented_accuracy" and float(hp["main"]) == pytest.approx(want, abs=1e-3)


def test_html_is_self_contained_with_plots_and_failures(report, world):
    results, paths = report
    page = paths["html"].read_text()
    assert page.count('<img class="plot"') == 3
    assert len(re.findall(r'src="data:image/png;base64,[A-Za-z0-9+/=]{500,}"', page)) >= 3
    assert not re.search(r'(src|href)="(https?:|//|file:)', page)  # no external assets
    assert '<table class="failures">' in page
    # the failure count is that of the last checkpoint's Parquet: view != original, top-1 perturbed
    t = pq.read_table(results / CHECKPOINTS[-1] / "rococo.parquet").to_pylist()
    n = sum(1 for r in t if r["kind"] == "ranking" and r["view"] != "original" and r["top1_group"] != "original")
    assert n > 15 and f"{n} queries whose top-1 is a perturbed item; showing 15" in page
    rows = re.findall(r'<tr><td>(i2t|t2i)</td><td>([^<]+)</td><td class="text">(?:<img[^>]*>)?(?:<code>)?([^<]+)'
                      r'(?:</code>)?</td><td class="text">(?:<img[^>]*>)?(?:<code>)?([^<]+)(?:</code>)?</td>'
                      r"<td>([^<]+)</td>", page)
    assert len(rows) == 15 and {task for task, *_ in rows} == {"i2t", "t2i"}
    for task, view, _, top1, group in rows:                      # the top-1 is an item of the view's variant
        assert view != "original" and group == view
        if task == "t2i":
            assert top1.startswith(f"{view}/val2014/")
        else:
            assert html.unescape(top1) in world["perturbed_texts"]
    # "fails in n/m": a query fails in at most every checkpoint, even when its caption is written twice
    fails = [tuple(map(int, m)) for m in re.findall(r'<td class="num">(\d+)/(\d+)</td></tr>', page)]
    assert len(fails) == 15 and all(1 <= n <= m == len(CHECKPOINTS) for n, m in fails)
    # every image cell (the i2t query, the t2i top-1) has its thumbnail: the images are on disk
    assert page.count('<img class="thumb" src="data:image/png;base64,') == 15
    for k in ("vs_step", "drops", "heatmap"):
        assert paths[f"plot_{k}"].read_bytes()[:4] == b"\x89PNG"


def test_markdown(report):
    _, paths = report
    md = paths["md"].read_text()
    assert "| checkpoint | step | rococo | hard_positives |" in md
    assert "![Per-variant drop](plots/drops.png)" in md
    assert "| task | view | query | top-1 (perturbed) |" in md


def test_name_order_and_duplicate_runs(world, tmp_path):
    _eval(world, tmp_path / "res" / "runA", ("final", "base"), tmp_path)
    _eval(world, tmp_path / "res" / "runB", ("final",), tmp_path)
    paths = build_report(tmp_path / "res")
    assert paths["html"].parent == tmp_path / "res" / "report"
    rows = list(csv.DictReader(paths["csv"].open()))
    assert rows[0]["order"] == "0" and rows[0]["step"] == "" and rows[0]["step_unit"] == ""  # no step in any name
    assert sorted({r["checkpoint"] for r in rows}) == ["runA/base", "runA/final", "runB/final"]
    # a second report skips its own output folder and the results are unchanged
    again = build_report(tmp_path / "res")
    assert list(csv.DictReader(again["csv"].open())) == rows


@pytest.mark.parametrize("damage", ["truncated", "random-bytes", "other-columns"])
def test_a_damaged_outcomes_parquet_is_named_and_the_report_written_whole(report, tmp_path, capsys, caplog, damage):
    """A per-query Parquet that cannot be read (cut short, overwritten, another table): one warning naming it,
    the report written whole with that checkpoint left out of the worst failures (the metrics come from the
    JSON files); it used to stop with a traceback after leaderboard.csv and the plots were written."""
    from hardrank.jobs.cli import main

    results = tmp_path / "results"
    shutil.copytree(report[0], results)
    bad = results / CHECKPOINTS[-1] / "rococo.parquet"
    if damage == "truncated":
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    elif damage == "random-bytes":
        bad.write_bytes(np.random.default_rng(0).bytes(bad.stat().st_size))
    else:
        pq.write_table(pa.table({"x": [1, 2]}), bad)
    with caplog.at_level(logging.WARNING):
        assert main(["report", str(results), "--out", str(tmp_path / "o")]) == 0
    assert "Traceback" not in capsys.readouterr().err
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith(f"{bad}: not a readable per-query Parquet ("), warned  # once
    assert f"the worst failures leave out checkpoint {CHECKPOINTS[-1]}" in warned[0]
    page, md = (tmp_path / "o" / "report.html").read_text(), (tmp_path / "o" / "report.md").read_text()
    assert f"Not read (its checkpoint is left out here): {bad}" in md and html.escape(str(bad)) in page
    # the metrics are those of the intact folder (from the JSON files); the intervals and gaps to the best come
    # from the outcomes, so the damaged checkpoint has none and the others are tested without it
    from_outcomes = ("result", "main_ci95_low", "main_ci95_high", "vs_best", "vs_best_p_holm", "vs_best_holds")
    metrics = lambda path: [{k: v for k, v in r.items() if k not in from_outcomes} for r in csv.DictReader(path.open())]
    assert metrics(tmp_path / "o" / "leaderboard.csv") == metrics(report[1]["csv"])
    damaged = [r for r in csv.DictReader((tmp_path / "o" / "leaderboard.csv").open())
               if r["checkpoint"] == CHECKPOINTS[-1] and r["suite"] == "rococo"]
    assert damaged and all(r["main_ci95_low"] == "" for r in damaged)
    assert "### rococo (checkpoint toy-clip_step0400)" in md  # the last checkpoint whose outcomes were read


def test_a_report_fails_before_writing_anything(report, tmp_path, monkeypatch):
    """Every part of a report is made before the first file is written: a failure on the way (here, the
    Markdown) leaves no leaderboard or plots of a report that never was."""
    import hardrank.jobs.report.build as build

    def boom(ctx, plot_files):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(build, "render_md", boom)
    with pytest.raises(RuntimeError, match="rendering failed"):
        build_report(report[0], tmp_path / "o")
    assert not (tmp_path / "o").exists() or list((tmp_path / "o").iterdir()) == []


def test_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        build_report(tmp_path / "nope")
    (tmp_path / "empty" / "x").mkdir(parents=True)
    (tmp_path / "empty" / "x" / "manifest.json").write_text('{"dim": 4}')  # a store manifest is no result
    with pytest.raises(DataError, match="no result files under"):
        build_report(tmp_path / "empty")
    with pytest.raises(ValueError, match="top must be >= 0"):
        build_report(tmp_path / "nope", top=-1)
    from hardrank.jobs.cli import main

    assert main(["report", str(tmp_path / "nope")]) == 3


def test_report_cli(world, tmp_path, capsys):
    from hardrank.jobs.cli import main

    _eval(world, tmp_path / "r", ("a_epoch_1", "a_epoch_2"), tmp_path)
    assert main(["report", str(tmp_path / "r"), "--out", str(tmp_path / "o"), "--top", "3"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "o" / f) for f in ("leaderboard.csv", "report.html", "report.md")]


def test_importing_the_report_command_imports_no_matplotlib():
    code = ("import sys, hardrank.jobs.report; "
            "sys.exit(any(m.split('.')[0] == 'matplotlib' for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_without_matplotlib_report_names_the_extra(report, tmp_path, monkeypatch, capsys):
    from hardrank.jobs.cli import main

    results, _ = report
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "hardrank.jobs.report.plots", raising=False)
    assert main(["report", str(results), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "hardrank report needs the optional package 'matplotlib'" in err
    assert "pip install 'hardrank[report]'" in err
    assert not (tmp_path / "o").exists()                  # checked before any work
    with pytest.raises(MissingExtra, match=r"pip install 'hardrank\[report\]'"):
        plot_bench({"stages": [], "end_to_end": {}}, tmp_path / "bench.png")


def test_screenshot_in_headless_chromium(report, tmp_path):
    exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if exe is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    _, paths = report
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
    assert type(bar).__name__ == "_Bar" and type(bar.bar).__name__ == "tqdm"
    bar.update(3)
    bar.close()


def test_several_runs_one_line_each_in_their_colour_and_marked_differences(world, tmp_path):
    """Two training runs in one results folder: every plot against step draws a line per run (runs named by
    their folder, never one sawtooth through both), each run in one colour in every plot; the leaderboard
    gives the main metric's interval and whether its gap to the suite's best holds."""
    from hardrank.jobs.report.load import checkpoint_axis, load_results
    from hardrank.jobs.report.plots import _label_colours, run_colours, vs_step_lines

    for run in ("runA", "runB"):
        _eval(world, tmp_path / "res" / run, ("toy_step0100", "toy_step0200", "toy_step0300"), tmp_path)
    results = load_results(tmp_path / "res", None)
    assert {r.run for r in results} == {"runA", "runB"}
    axis = checkpoint_axis(sorted({r.label for r in results}))
    rococo = [r for r in results if r.suite == "rococo"]
    lines = vs_step_lines(rococo, axis)
    assert {run for run, _ in lines} == {"runA", "runB"}
    for (run, name), line in lines.items():
        xs = [x for x, _ in line["stepped"]]
        assert xs == [100.0, 200.0, 300.0], (run, name, xs)  # its own steps, in order: no sawtooth
    colours = run_colours(results)
    assert colours == run_colours(list(reversed(results))) and colours["runA"] != colours["runB"]
    by_suite = {s: [r for r in results if r.suite == s] for s in {r.suite for r in results}}
    colour = _label_colours(by_suite, axis.order, None)
    a_last, b_last = colour("runA/toy_step0300", 0, 1), colour("runB/toy_step0300", 0, 1)
    assert np.allclose(a_last[:3], colours["runA"][:3]) and np.allclose(b_last[:3], colours["runB"][:3])
    paths = build_report(tmp_path / "res")
    rows = list(csv.DictReader(paths["csv"].open()))
    ranked = [r for r in rows if r["suite"] == "rococo"]
    for r in ranked:
        assert float(r["main_ci95_low"]) <= float(r["main"]) <= float(r["main_ci95_high"])
    best = [r for r in ranked if float(r["vs_best"]) == 0]
    others = [r for r in ranked if float(r["vs_best"]) < 0]
    assert best and others and all(r["vs_best_holds"] in ("True", "False") for r in others)
    assert any(r["vs_best_holds"] == "True" for r in others)  # step 100 is far below the best
    page = paths["html"].read_text()
    assert "no difference from the best that holds" in page and re.search(r"\[\d+\.\d, \d+\.\d\]", page)
