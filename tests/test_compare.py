"""Checkpoints compared with confidence on real toy runs: ci95 in results, `hardrank compare`, lite subsets,
training dashboards (TensorBoard, W&B offline, MLflow file store read back), and their bad inputs."""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import hardrank
from hardrank.compare import compare_checkpoints, pick
from hardrank.errors import DataError
from hardrank.jobs.cli import main
from hardrank.scoring.statistics import get_path
from hardrank.toyworld import TOY_CHECKPOINTS, TOY_MODEL, WorldConfig, build_world

CKPTS = [str(TOY_CHECKPOINTS / f"toy-clip_step{s:04d}.safetensors") for s in (100, 400, 700)]
SUITES = ["toy-rococo", "toy-hard-positives", "toy-classify"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    world = build_world(tmp / "world", WorldConfig(n_train=10, n_test=60, n_inpaint=20))
    common = ["--model", str(TOY_MODEL), "--data", str(world), "--store", str(tmp / "store"), "--device", "cpu",
              "--batch-size", "64", "--decode-threads", "2", "--quiet"]
    return {"tmp": tmp, "world": world, "common": common}


@pytest.fixture(scope="module")
def full(toy):
    out = toy["tmp"] / "full"
    assert main(["eval", "--checkpoint", *CKPTS, "--suite", *SUITES, "--out", str(out), *toy["common"]]) == 0
    return out


def test_every_headline_metric_has_its_interval(full, capsys):
    for r in hardrank.read_results(full):
        st = r.data["statistics"]
        assert (st["level"], st["resamples"], st["seed"]) == (0.95, 1000, 0) and st["units"] > 0
        assert st["unit"].startswith({"ranking": "image", "choice": "item", "classification": "image"}[
            r.data["task_type"]])
        for col, path in hardrank.scoring.results.headline_paths(r.data).items():
            lo, hi = get_path(r.data["ci95"], path)
            v = get_path(r.data["metrics"], path)
            assert lo <= v + 1e-6 and v - 1e-6 <= hi, (r.path, col, lo, v, hi)
        pq_cols = pq.read_schema(r.path.with_suffix(".parquet")).names
        assert "unit" in pq_cols and "verdicts" in pq_cols
    rococo = json.loads((full / "toy-clip_step0700" / "toy-rococo.json").read_text())
    assert get_path(rococo["ci95"], ("same_concept", "i2t", "drop", "R@1")) is not None
    assert get_path(rococo["ci95"], ("original", "mean", "R@1")) is not None
    # each i2t query's unit is its image; a caption's, the image it describes
    t = pq.read_table(full / "toy-clip_step0700" / "toy-rococo.parquet").to_pydict()
    rows = list(zip(t["task"], t["query_id"], t["unit"]))
    assert all(q == u for task, q, u in rows if task == "i2t")
    assert len({u for task, _, u in rows if task == "t2i"}) == 60


def test_the_eval_table_shows_half_widths(toy, tmp_path, capsys):
    assert main(["eval", "--checkpoint", CKPTS[-1], "--suite", "toy-hard-positives", "--out", str(tmp_path),
                 "--bootstrap", "200", "--seed", "3", *toy["common"]]) == 0
    out = capsys.readouterr().out
    assert "±" in out and "95% bootstrap interval" in out
    r = json.loads((tmp_path / "toy-clip_step0700" / "toy-hard-positives.json").read_text())
    assert (r["statistics"]["resamples"], r["statistics"]["seed"]) == (200, 3)
    assert main(["eval", "--checkpoint", CKPTS[-1], "--suite", "toy-hard-positives", "--out", str(tmp_path / "n"),
                 "--bootstrap", "0", *toy["common"]]) == 0
    r = json.loads((tmp_path / "n" / "toy-clip_step0700" / "toy-hard-positives.json").read_text())
    assert "ci95" not in r and "±" not in capsys.readouterr().out


def test_compare_prints_which_checkpoint_is_better_where(full, tmp_path, capsys):
    assert main(["compare", str(full), "--json", str(tmp_path / "cmp.json")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("compare: A = toy-clip_step0400, B = toy-clip_step0700")
    assert "Holm-adjusted over the" in out and len(lines) < 60  # one screen
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert doc["correction"].startswith("Holm over the") and doc["metrics"]
    tests = {m["metric"]: m["test"] for m in doc["metrics"]}
    assert tests["i2t R@1"] == "mcnemar" and tests["toy_swap augmented"] == "mcnemar"
    assert all(m["p_holm"] >= m["p"] for m in doc["metrics"])
    # step 100 against step 700: differences that hold, B better
    assert main(["compare", str(full), "--a", "toy-clip_step0100", "--b", "toy-clip_step0700",
                 "--suite", "toy-rococo"]) == 0
    out = capsys.readouterr().out
    summary = [l for l in out.splitlines() if l.startswith("B (toy-clip_step0700) better on")][0]
    assert int(summary.split("better on ")[1].split(",")[0]) > 0
    i2t = [l for l in out.splitlines() if l.startswith("toy-rococo") and " i2t R@1 " in l][0]
    assert i2t.rstrip().endswith("toy-clip_step0700")


def test_compare_two_folders_and_bad_input(full, toy, tmp_path, capsys):
    sub = tmp_path / "sub"
    assert main(["eval", "--checkpoint", CKPTS[-1], "--suite", "toy-hard-positives", "--out", str(sub),
                 "--subset", "30", "--seed", "2", *toy["common"]]) == 0
    capsys.readouterr()
    # different items: one line naming them, exit 3
    assert main(["compare", str(full), str(sub), "--a", "toy-clip_step0400"]) == 3
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "were evaluated on different items" in err and "unit(s) only in the first" in err
    # a result without per-item outcomes (its Parquet removed)
    gone = tmp_path / "gone"
    for c in ("toy-clip_step0400", "toy-clip_step0700"):
        (gone / c).mkdir(parents=True)
        (gone / c / "toy-hard-positives.json").write_text((full / c / "toy-hard-positives.json").read_text())
    assert main(["compare", str(gone)]) == 3
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no per-item outcomes" in err
    # a folder with one checkpoint, and two folders of one each
    assert main(["compare", str(sub)]) == 2
    assert "compare needs two" in capsys.readouterr().err
    a, b = pick(full, sub, a="toy-clip_step0700")
    assert (a.name, b.name) == ("toy-clip_step0700", "toy-clip_step0700")
    with pytest.raises(DataError, match="different items"):
        compare_checkpoints(a, b)


def test_lite_subset_is_stratified_seeded_and_recorded(full, toy, tmp_path):
    outs = []
    for i, seed in enumerate((5, 5, 6)):
        out = tmp_path / f"s{i}"
        rep = hardrank.evaluate(model=str(TOY_MODEL), checkpoints=[CKPTS[-1]], suites=SUITES, data=str(toy["world"]),
                                out=str(out), store=str(toy["tmp"] / "store"), device="cpu", subset=24, seed=seed,
                                bootstrap=50)
        outs.append({r["suite"]: r for r in rep.results})
    a, b, c = outs
    for s in SUITES:
        rec = a[s]["subset"]
        assert (rec["units"], rec["seed"], rec["asked"]) == (24, 5, 24) and rec["of"] > 24
        assert a[s]["metrics"] == b[s]["metrics"]
    assert a["toy-rococo"]["counts"]["original"]["i2t"] == {"queries": 24, "gallery": sum(
        1 for _ in range(a["toy-rococo"]["counts"]["original"]["t2i"]["queries"]))}  # 24 images, their captions
    assert a["toy-rococo"]["counts"]["original"]["t2i"]["gallery"] == 24
    assert a["toy-rococo"]["metrics"] != c["toy-rococo"]["metrics"] or a["toy-rococo"]["counts"] != \
        c["toy-rococo"]["counts"]
    hp = pq.read_table(tmp_path / "s0" / "toy-clip_step0700" / "toy-hard-positives.parquet").to_pydict()
    per_task = {t: hp["task"].count(t) for t in set(hp["task"])}
    assert sum(per_task.values()) == 24 and len(per_task) == 2 and min(per_task.values()) >= 10  # strata: tasks
    zs = pq.read_table(tmp_path / "s0" / "toy-clip_step0700" / "toy-classify.parquet").to_pydict()
    clean = [c for v, c in zip(zs["view"], zs["subset"]) if v == "clean"]
    assert len(clean) == 24 and len(set(clean)) == min(24, len(set(pq.read_table(
        full / "toy-clip_step0700" / "toy-classify.parquet").column("subset").to_pylist())))  # every class kept
    plan = hardrank.plan(model=str(TOY_MODEL), checkpoints=[CKPTS[-1]], suites=["toy-rococo"], data=str(toy["world"]),
                         out=str(tmp_path / "p"), store=str(tmp_path / "empty-store"), device="cpu", subset=10)
    full_plan = hardrank.plan(model=str(TOY_MODEL), checkpoints=[CKPTS[-1]], suites=["toy-rococo"],
                              data=str(toy["world"]), out=str(tmp_path / "p"), store=str(tmp_path / "empty-store"),
                              device="cpu")
    assert plan["images"] * 5 < full_plan["images"] and plan["texts"] * 5 < full_plan["texts"]  # only its items


# -- training dashboards: written by --log-to, read back with each tool's own reader ---------------------------

def _wandb_records(run_dir: Path) -> list:
    """The records of a W&B offline run file (``run-<id>.wandb``: W&B's LevelDB-style log of protobuf records)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, out, part = 32768, 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            break
        part += chunk
        if kind in (1, 4):  # FULL or LAST
            rec = pb.Record()
            rec.ParseFromString(part)
            out.append(rec)
            part = b""
    return out


def test_log_to_every_dashboard_and_read_it_back(toy, tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch.utils.tensorboard")
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    (tmp_path / "wandb").mkdir()
    out = tmp_path / "r"
    assert main(["eval", "--checkpoint", *CKPTS[1:], "--suite", "toy-hard-positives", "--out", str(out),
                 "--log-to", f"tensorboard:{tmp_path / 'tb'}", "--log-to", "wandb:hardrank-test",
                 "--log-to", f"mlflow:{tmp_path / 'mlruns'}", "--bootstrap", "0", *toy["common"]]) == 0
    want = {}
    for step, c in ((400, "toy-clip_step0400"), (700, "toy-clip_step0700")):
        r = json.loads((out / c / "toy-hard-positives.json").read_text())
        want[step] = hardrank.scoring.results.summary_row(r)
    key = "toy_swap augmented"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    got = {e.step: e.value for e in ea.Scalars(f"toy-hard-positives/{key}")}
    assert got == pytest.approx({s: w[key] for s, w in want.items()})
    records = _wandb_records(next((tmp_path / "wandb" / "wandb").glob("offline-run-*")))
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.project == "hardrank-test"
    hist = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]
    logged = {h["checkpoint_step"]: h[f"toy-hard-positives/{key}"] for h in hist}
    assert logged == pytest.approx({s: w[key] for s, w in want.items()})
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (exp,) = [e for e in client.search_experiments() if e.name == "hardrank"]
    (run,) = client.search_runs([exp.experiment_id])
    hist = client.get_metric_history(run.info.run_id, f"toy-hard-positives/{key}")
    assert {m.step: m.value for m in hist} == pytest.approx({s: w[key] for s, w in want.items()})
    assert run.data.tags["hardrank_results"] == str(out.resolve())


def test_an_unknown_or_missing_logger_is_one_line(toy, tmp_path, monkeypatch, capsys):
    base = ["eval", "--checkpoint", CKPTS[-1], "--suite", "toy-hard-positives", "--out", str(tmp_path), *toy["common"]]
    assert main([*base, "--log-to", "neptune:proj"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown logger 'neptune'" in err and "tensorboard:DIR" in err
    assert main([*base, "--log-to", "wandb"]) == 2
    assert "wandb needs its PROJECT after the colon" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main([*base, "--log-to", "wandb:p"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'hardrank[wandb]'" in err
    assert not (tmp_path / "toy-clip_step0700").exists()  # refused before any work


def test_subset_refuses_mask_suites_before_work(tmp_path):
    with pytest.raises(hardrank.UsageError, match="scores masks, which have no lite subset"):
        from hardrank.subsets import subset_suites
        from hardrank.tasks import MaskTask, Suite
        subset_suites([Suite("amodal", mask=[MaskTask("predictions", data=None, predictions="p")])],
                      hardrank.Tables.empty(), 5, 0)



