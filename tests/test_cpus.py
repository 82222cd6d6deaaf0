"""The thread budget (hardrank.cpus): affinity, cgroup quota, overrides, the idle probe; --threads reaches the
pools and the records; results do not depend on the thread count."""
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config

from hardrank import cpus
from hardrank.errors import UsageError
from hardrank.jobs.cli import main


@pytest.fixture(autouse=True)
def _restore_budget(monkeypatch):
    """Each test leaves torch's threads, the applied budget and the hooks as it found them."""
    for name in cpus.ENV_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    threads, applied, hooks, probed = torch.get_num_threads(), cpus._APPLIED, list(cpus._HOOKS), cpus._PROBED
    yield
    torch.set_num_threads(threads)
    cpus._APPLIED, cpus._PROBED = applied, probed
    cpus._HOOKS[:] = hooks


def _fake_cgroup(monkeypatch, tmp_path, self_cgroup: str, files: dict[str, str], affinity: int = 8):
    (tmp_path / "self_cgroup").write_text(self_cgroup)
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    monkeypatch.setattr(cpus, "PROC_SELF_CGROUP", tmp_path / "self_cgroup")
    monkeypatch.setattr(cpus, "CGROUP_ROOT", root)
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: set(range(affinity)))


def test_cores_are_the_tighter_of_affinity_and_a_cgroup_v2_quota(monkeypatch, tmp_path):
    # the process's own cgroup allows 1.5 cores (rounded up to 2 threads); its parent sets no limit
    _fake_cgroup(monkeypatch, tmp_path, "0::/jobs/run7\n",
                 {"jobs/run7/cpu.max": "150000 100000\n", "jobs/cpu.max": "max 100000\n"})
    b = cpus.budget(probe=False)
    assert (b.threads, b.cores, b.affinity, b.quota, b.source) == (2, 2, 8, 1.5, "cores")
    assert b.describe() == "2 (affinity 8, quota 1.5)"
    # a parent's tighter limit binds too
    (tmp_path / "cgroup" / "jobs" / "cpu.max").write_text("100000 100000\n")
    assert cpus.budget(probe=False).cores == 1
    # no quota anywhere: the affinity mask
    _fake_cgroup(monkeypatch, tmp_path, "0::/\n", {"cpu.max": "max 100000\n"}, affinity=3)
    b = cpus.budget(probe=False)
    assert (b.threads, b.quota) == (3, None) and b.describe() == "3 (affinity 3, quota none)"


def test_cgroup_v1_quota_and_container_root(monkeypatch, tmp_path):
    # v1: cpu.cfs_quota_us / cpu.cfs_period_us; inside a container the named path is the host's, the
    # container's own limit sits at the mount root
    _fake_cgroup(monkeypatch, tmp_path, "4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n",
                 {"cpu,cpuacct/cpu.cfs_quota_us": "300000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cpus.cgroup_quota() == 3.0 and cpus.budget(probe=False).cores == 3
    _fake_cgroup(monkeypatch, tmp_path, "4:cpu,cpuacct:/\n",
                 {"cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"})
    assert cpus.cgroup_quota() is None and cpus.budget(probe=False).cores == 8


def test_overrides_in_order_and_refused_when_malformed(monkeypatch, tmp_path):
    _fake_cgroup(monkeypatch, tmp_path, "0::/\n", {}, affinity=2)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpus.budget(probe=False).threads == 3  # an explicit count may exceed the cores: the user's call
    monkeypatch.setenv("HARDRANK_THREADS", "1")
    b = cpus.budget(probe=False)
    assert (b.threads, b.source) == (1, "$HARDRANK_THREADS")
    assert b.describe() == "1 ($HARDRANK_THREADS 1; affinity 2, quota none)"
    b = cpus.budget(4, probe=False)
    assert (b.threads, b.source, b.cores) == (4, "--threads", 2)
    with pytest.raises(UsageError, match=r"option threads \(--threads\) must be a whole number >= 1, got 0"):
        cpus.budget(0)
    monkeypatch.setenv("HARDRANK_THREADS", "two")
    with pytest.raises(UsageError, match=r"\$HARDRANK_THREADS is 'two': set it to a whole number >= 1"):
        cpus.budget()


def test_idle_probe_leaves_the_cores_a_neighbour_keeps_busy(monkeypatch, tmp_path):
    """/proc/stat sampled over this process's CPUs (2 of 3 here): one busy core of two -> 1 thread; a
    saturated machine (as many runnable tasks as CPUs) keeps every core: fewer threads would cede time."""
    _fake_cgroup(monkeypatch, tmp_path, "0::/\n", {}, affinity=2)
    stat = tmp_path / "stat"
    line = "cpu{} {} 0 0 {} 0 0 0 0 0 0\n"  # user nice system idle iowait ...

    def snapshot(busy0, busy1, running, t):  # t x 100 jiffies per core elapsed; cpu2 lies outside the mask
        return ("cpu  0 0 0 0 0 0 0 0\n" + line.format(0, t * busy0, t * (100 - busy0))
                + line.format(1, t * busy1, t * (100 - busy1)) + line.format(2, t * 100, 0)
                + f"intr 5 0\nctxt 7\nprocs_running {running}\nprocs_blocked 0\n")

    def probe(busy0, busy1, running):
        stat.write_text(snapshot(busy0, busy1, running, 1))
        monkeypatch.setattr(cpus.time, "sleep", lambda s: stat.write_text(snapshot(busy0, busy1, running, 2)))
        return cpus.budget()

    monkeypatch.setattr(cpus, "PROC_STAT", stat)
    b = probe(100, 5, 2)  # a CPU-bound neighbour on cpu0 (running: it and this probe)
    assert (b.threads, b.source, b.idle, b.runnable) == (1, "idle cores", 0.95, 1.0)
    assert b.describe() == "1 (0.9 of 2 cores idle at start; affinity 2, quota none)"
    b = probe(10, 20, 1)  # quiet
    assert (b.threads, b.source, b.idle) == (2, "cores", 1.7)
    assert b.describe() == "2 (1.7 of 2 cores idle at start; affinity 2, quota none)"
    b = probe(100, 100, 9)  # 8 other runnable tasks on 3 CPUs
    assert (b.threads, b.source, b.runnable) == (2, "saturated", 8.0)
    assert b.describe().startswith("2 (saturated at start: 8 other tasks runnable")
    assert cpus.budget(2).source == "--threads"  # an explicit count is never probed
    monkeypatch.setattr(cpus, "PROC_STAT", tmp_path / "missing")
    assert cpus.budget().threads == 2  # no /proc: the cores


def test_a_recent_look_at_the_idle_cores_is_reused(monkeypatch, tmp_path):
    _fake_cgroup(monkeypatch, tmp_path, "0::/\n", {}, affinity=2)
    looks = []
    monkeypatch.setattr(cpus, "probe_cores", lambda: looks.append(1) or (0.9, 1.0, 2))
    monkeypatch.setattr(cpus, "_PROBED", None)
    assert cpus.use().threads == 1 and cpus.use().threads == 1 and len(looks) == 1
    assert cpus.use(2).threads == 2 and len(looks) == 1  # an explicit count: no look
    monkeypatch.setattr(cpus, "_PROBED", (cpus._PROBED[0] - cpus.PROBE_REUSE_S - 1, cpus._PROBED[1]))
    assert cpus.use().threads == 1 and len(looks) == 2  # too old: looked again


def test_use_sizes_torch_and_registered_pools(monkeypatch, tmp_path):
    _fake_cgroup(monkeypatch, tmp_path, "0::/\n", {}, affinity=2)
    # as in a fresh process: no budget applied yet by an earlier run in this one, and only this test's hook
    monkeypatch.setattr(cpus, "_APPLIED", None)
    monkeypatch.setattr(cpus, "_HOOKS", [])
    seen = []
    cpus.on_use(seen.append)
    b = cpus.use(1)
    assert torch.get_num_threads() == 1 and cpus.current() is b and seen == [1]
    assert cpus.decode_threads() == 1
    cpus.on_use(seen.append)  # registered after a budget is applied: sized at once
    assert seen == [1, 1]
    cpus.use(2, probe=False)
    assert torch.get_num_threads() == 2 and seen == [1, 1, 2, 2]
    rec = cpus.current().record()
    assert rec["threads"] == 2 and rec["description"].startswith("2 (--threads 2;") and rec["wait_policy"]


def test_faiss_threads_follow_the_budget():
    faiss_index = pytest.importorskip("hardrank.scoring.faiss_index")
    n = faiss_index.faiss.omp_get_max_threads()
    try:
        cpus.use(1)
        assert faiss_index.faiss.omp_get_max_threads() == 1
        cpus.use(2)
        assert faiss_index.faiss.omp_get_max_threads() == 2
    finally:
        faiss_index.faiss.omp_set_num_threads(n)


def test_local_ray_cluster_gets_the_budget_as_its_cpus(monkeypatch):
    ray_embed = pytest.importorskip("hardrank.executors.ray_embed")
    got = {}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_embed.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_embed.ray, "init", lambda **kw: got.update(kw))
    cpus.use(1)
    assert ray_embed.connect(None) is True and got["num_cpus"] == 1


def test_torch_imported_first_is_reported_as_spinning():
    """libgomp reads OMP_WAIT_POLICY when torch loads it: hardrank's PASSIVE comes too late after `import torch`."""
    env_free = "import os; os.environ.pop('OMP_WAIT_POLICY', None); "
    out = subprocess.run([sys.executable, "-c", env_free + "import torch, hardrank.cpus as c; print(c.wait_policy())"],
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.startswith("spin (torch was imported before hardrank"), out.stderr[-2000:]
    assert cpus.wait_policy() in ("PASSIVE", "ACTIVE") or cpus.wait_policy().startswith("spin")


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory):
    root = tmp_path_factory.mktemp("threads_world")
    w = make_karpathy_world(root, n_images=10)
    w["cfg"] = write_tiny_config(root)
    w["ckpt"] = save_random_checkpoint(w["cfg"], root / "a.safetensors", 0)
    return w


def _eval(world, tmp_path, threads: int) -> dict:
    out, store = tmp_path / f"out{threads}", tmp_path / f"store{threads}"  # own store: encoded with these threads
    assert main(["eval", "--model", str(world["cfg"]), "--checkpoint", str(world["ckpt"]), "--suite", "rococo",
                 "--annotations", str(world["annotations"]), "--images", str(world["images"]), "--device", "cpu",
                 "--store", str(store), "--out", str(out), "--batch-size", "3", "--threads", str(threads),
                 "--quiet"]) == 0
    assert torch.get_num_threads() == threads
    return json.loads((out / "a" / "rococo.json").read_text())


def test_eval_threads_flag_is_used_recorded_and_changes_no_result(tiny_world, tmp_path):
    one, two = _eval(tiny_world, tmp_path, 1), _eval(tiny_world, tmp_path, 2)
    assert one["provenance"]["threads"]["threads"] == 1 and one["provenance"]["threads"]["source"] == "--threads"
    assert two["provenance"]["threads"]["description"].startswith("2 (--threads 2;")
    assert one["metrics"] == two["metrics"] and one["counts"] == two["counts"]
    outcomes = [pq.read_table(tmp_path / f"out{t}" / "a" / "rococo.parquet") for t in (1, 2)]
    assert outcomes[0].equals(outcomes[1])


def test_mine_threads_flag_is_recorded_and_exact_search_is_thread_independent(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((700, 24)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[5] = x[9]  # ties: the lower index wins whatever the threads
    kinds = ["image"] * 600 + ["text"] * 100
    emb = tmp_path / "emb.parquet"
    pq.write_table(pa.table({"kind": kinds, "id": [f"{k}{i}" for i, k in enumerate(kinds)],
                             "embedding": pa.array(list(x), pa.list_(pa.float32(), 24))}), emb)
    runs = {}
    for t in (1, 2):
        assert main(["mine", "--corpus", str(emb), "--queries", str(emb), "--direction", "t2i", "-k", "7",
                     "--no-dup-filter", "--search", "exact", "--threads", str(t), "--out", str(tmp_path / f"m{t}"),
                     "--quiet"]) == 0
        summary = json.loads((tmp_path / f"m{t}" / "summary.json").read_text())
        assert summary["threads"]["threads"] == t and torch.get_num_threads() == t
        runs[t] = pq.read_table(tmp_path / f"m{t}" / "negatives").sort_by([("query_id", "ascending"),
                                                                          ("rank", "ascending")])
    assert runs[1].equals(runs[2]) and runs[1].num_rows == 700
