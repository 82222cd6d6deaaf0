"""The results files are a public contract: a real toy run compared field by field with golden files.

The golden files (tests/golden/) hold one real result per task type (ranking, choice, mask: a
toy checkpoint on a small toy world) and the outcome Parquet schema. Values that depend on the
machine or the run (paths, timings, library versions) are stored as ``"<path>"``, ``"<float>"``,
``"<str>"``...: their key must exist and hold that type. Every other value must be equal (metric
floats and their ci95 intervals within 0.5 points: another CPU may round a near tie the other way).
A deliberate change of the contract is made by regenerating them and reviewing the diff:

    HARDRANK_REGENERATE_GOLDEN=1 python -m pytest tests/test_results_contract.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import hardrank
from hardrank.scoring.results import outcome_schema
from hardrank.toyworld import TOY_CHECKPOINTS, TOY_MODEL, WorldConfig, build_world
from hardrank.toyworld.amodal import build_amodal_world

GOLDEN = Path(__file__).parent / "golden"
REGENERATE = os.environ.get("HARDRANK_REGENERATE_GOLDEN") == "1"
WORLD = WorldConfig(n_train=10, n_test=60, n_inpaint=20)
CHECKPOINT = TOY_CHECKPOINTS / "toy-clip_step0700.safetensors"
# result files compared: one suite per task type and the prediction-only mask result
FILES = ("toy-clip_step0700/toy-rococo.json", "toy-clip_step0700/toy-hard-positives.json",
         "toy-clip_step0700/amodal.json", "noisy/amodal.json")
_VOLATILE = {"timings", "versions", "seconds", "items_per_s", "stage_seconds", "exact_seconds"}


def _placeholder(value, key: str, under: tuple[str, ...]):
    """The golden form of a leaf: its type for values that vary between machines and runs."""
    if isinstance(value, str) and (os.path.isabs(value) or value.startswith(("local-dir:", "parquet://"))):
        return "<path>"
    if {key, *under} & _VOLATILE:
        return f"<{type(value).__name__}>"
    if under[:1] == ("provenance",) and under[1:2] == ("versions",):
        return "<str>"
    return value


def _golden_form(obj, key: str = "", under: tuple[str, ...] = ()):
    if key == "threads" and isinstance(obj, dict):  # the thread budget: its fields are the machine's (quota, load)
        return "<dict>"
    if isinstance(obj, dict):
        return {k: _golden_form(v, k, (*under, key) if key else under) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_golden_form(v, key, under) for v in obj]
    return _placeholder(obj, key, under)


def _compare(golden, actual, where: str, problems: list[str]) -> None:
    if isinstance(golden, dict):
        if not isinstance(actual, dict):
            problems.append(f"{where}: expected an object, got {actual!r}")
            return
        for k in golden.keys() - actual.keys():
            problems.append(f"{where}.{k}: missing")
        for k in actual.keys() - golden.keys():
            problems.append(f"{where}.{k}: new field (not in the golden file)")
        for k in golden.keys() & actual.keys():
            _compare(golden[k], actual[k], f"{where}.{k}", problems)
    elif isinstance(golden, list):
        if not isinstance(actual, list) or len(actual) != len(golden):
            problems.append(f"{where}: expected a list of {len(golden)}, got {actual!r}"[:300])
            return
        for i, (g, a) in enumerate(zip(golden, actual)):
            _compare(g, a, f"{where}[{i}]", problems)
    elif isinstance(golden, str) and golden.startswith("<") and golden.endswith(">"):
        want = golden[1:-1]
        ok = (want == "path" and isinstance(actual, str)) or type(actual).__name__ == want \
            or (want == "float" and isinstance(actual, int)) or (want == "NoneType" and actual is None)
        if not ok:
            problems.append(f"{where}: expected a {want}, got {actual!r}")
    elif isinstance(golden, float) and isinstance(actual, (int, float)) and (
            ".metrics." in where + "." or ".ci95." in where + "."):  # intervals move with the metrics
        if abs(golden - actual) > 0.5:
            problems.append(f"{where}: {actual} differs from the golden {golden} by more than 0.5")
    elif golden != actual:
        problems.append(f"{where}: {actual!r} != golden {golden!r}")


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("contract")
    world = build_world(tmp / "world", WORLD)
    amodal = build_amodal_world(tmp / "amodal", n_images=12)
    common = dict(model=str(TOY_MODEL), checkpoints=[str(CHECKPOINT)], out=str(tmp / "out"), store=str(tmp / "store"),
                  device="cpu", batch_size=64, decode_threads=2)
    hardrank.evaluate(suites=["toy-rococo", "toy-hard-positives"], data=str(world), **common)
    hardrank.evaluate(suites=["amodal"], data=str(amodal), predictions=str(amodal / "predictions" / "noisy"),
                      baseline="clip-regions", **common)
    return tmp / "out"


@pytest.mark.parametrize("name", FILES)
def test_result_json_matches_the_golden_file(toy_run, name):
    actual = json.loads((toy_run / name).read_text())
    path = GOLDEN / name.replace("/", "__")
    if REGENERATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(_golden_form(actual), indent=1, sort_keys=True) + "\n")
    problems: list[str] = []
    _compare(json.loads(path.read_text()), actual, name, problems)
    assert not problems, ("the results contract changed (if on purpose, regenerate tests/golden with "
                          "HARDRANK_REGENERATE_GOLDEN=1 and review the diff):\n" + "\n".join(problems[:40]))


def test_outcome_parquet_schema_is_pinned(toy_run):
    golden = GOLDEN / "outcomes.schema.json"
    schema = [[f.name, str(f.type)] for f in outcome_schema()]
    if REGENERATE:
        golden.write_text(json.dumps(schema, indent=1) + "\n")
    assert schema == json.loads(golden.read_text())
    for name in FILES:  # every written Parquet has exactly this schema
        written = pq.read_schema(toy_run / name.replace(".json", ".parquet"))
        # Parquet names a list's item "element" and a map's entries after the column; the Arrow type is the same
        assert [[f.name, str(f.type).replace("<element:", "<item:").replace(f" ('{f.name}')", "")]
                for f in written] == schema, name


def test_the_golden_files_are_checked_in():
    """The comparison above cannot pass vacuously: every golden file exists and holds metrics."""
    for name in FILES:
        g = json.loads((GOLDEN / name.replace("/", "__")).read_text())
        assert g["metrics"] and g["counts"] and g["result_version"] == 1, name
