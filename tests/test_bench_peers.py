"""benchmarks/bench_peers.py's table and JSON from fake rows (the peers themselves run only in `make bench-peers`)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_peers.py"


@pytest.fixture(scope="module")
def bp():
    spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_peers"] = mod  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop("bench_peers", None)
    return mod


def _fake_rows(bp):
    k4 = bp.Row("retrieval K=4", "CLIP_benchmark", ours=[10.0, 12.0], theirs=[20.0, 25.0],
                metrics_ours={"i2t_R@1": 85.7, "t2i_R@1": 76.786427},
                metrics_theirs={"i2t_R@1": 85.70000171661377, "t2i_R@1": 76.78642868995667},
                load={"before": (1.0, 1.0, 1.0), "after": (2.5, 1.0, 1.0)})
    k4.agree = bp.agree(k4.metrics_ours, k4.metrics_theirs)
    rate = bp.Row("image inference", "clip-retrieval", unit="img/s", ours=[12.0, 14.0], theirs=[10.0, 7.0],
                  note="rates")
    zs = bp.Row("zero-shot classification K=4", "CLIP_benchmark", available=False)
    return {"k4": lambda: k4, "inference": lambda: rate, "zeroshot": lambda: zs}


def test_table_and_json_from_fake_runners(bp, tmp_path, capsys):
    out = tmp_path / "r" / "peers.json"
    rows = bp.run_rows(["k4", "inference", "zeroshot"], _fake_rows(bp), out, {"repeat": 2})
    printed = capsys.readouterr().out
    assert "| retrieval K=4 | CLIP_benchmark | 10.0-12.0 s | 20.0-25.0 s | 2.00x | yes | 1.0/2.5 |" in printed
    # a rate: higher is better, best against best
    assert "| image inference | clip-retrieval | 12.0-14.0 img/s | 7.0-10.0 img/s | 1.40x | - | - |" in printed
    assert "| zero-shot classification K=4 | CLIP_benchmark | not available in this checkout |" in printed
    assert "- image inference: rates" in printed
    data = json.loads(out.read_text())
    assert [r["name"] for r in data["rows"]] == [r.name for r in rows]
    first = data["rows"][0]
    assert (first["ours_min"], first["ours_max"], first["theirs_min"], first["theirs_max"]) == (10.0, 12.0, 20.0, 25.0)
    assert first["hardrank_faster"] == 2.0 and first["agree"] is True and first["load"]["after"][0] == 2.5
    assert data["rows"][2]["available"] is False and data["rows"][2]["hardrank_faster"] is None
    assert data["args"] == {"repeat": 2} and data["machine"]["cores"] >= 1


def test_metrics_disagree_beyond_the_tolerance(bp):
    assert bp.agree({"i2t_R@1": 85.7}, {"i2t_R@1": 85.6}) is False
    assert bp.agree({"i2t_R@1": 85.7}, {"t2i_R@1": 85.7}) is None  # nothing in common: nothing compared
    row = bp.Row("x", "p", ours=[1.0], theirs=[1.0], agree=False)
    assert "| **no** |" in bp.table([row])


def test_a_peer_past_its_time_limit_is_reported_unfinished(bp, tmp_path, monkeypatch):
    """The ANN row stops autofaiss at --peer-timeout: our side is timed, theirs says unfinished, no ratio."""
    import subprocess

    monkeypatch.setattr(bp, "peer_python", lambda venvs, name: Path(sys.executable))

    def too_slow(cmd, env=None, cwd=None, timeout=None):
        raise subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(bp, "_run", too_slow)
    row = bp.row_ann(tmp_path, tmp_path, n=2_000, nq=50, dim=16, budget_mb=1, repeat=1, peer_timeout=3)
    assert len(row.ours) == 1 and row.theirs == [] and row.ratio() is None
    assert row.metrics_ours["recall@10"] > 0 and "after 3 s" in row.metrics_theirs["unfinished"]
    assert "did not finish within --peer-timeout 3 s" in row.note
    assert "| - |" in bp.table([row])
