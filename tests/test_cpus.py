"""The thread budget (hardrank.cpus) and the run's settings (hardrank.settings): affinity, cgroup quota,
overrides, the idle probe, the range of thread counts; --threads reaches the pools and the records; two runs
in one process each use and record their own; results do not depend on the thread count."""
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config

import hardrank
from hardrank import cpus
from hardrank.config import EmbedOptions
from hardrank.errors import UsageError
from hardrank.executors import LocalRunner, executor
from hardrank.jobs.cli import main
from hardrank.settings import RunSettings, start_run


@pytest.fixture(autouse=True)
def _restore_budget(monkeypatch):
    """Each test leaves torch's threads and the cached look at the idle cores as it found them."""
    for name in cpus.ENV_OVERRIDES:
        monkeypatch.delenv(name, raising=False)
    threads, probed = torch.get_num_threads(), cpus._PROBED
    yield
    torch.set_num_threads(threads)
    cpus._PROBED = probed


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
    with pytest.raises(UsageError, match=r"option threads \(--threads\) must be a whole number in 1\.\.\d+ .*, got 0"):
        cpus.budget(0)
    monkeypatch.setenv("HARDRANK_THREADS", "two")
    with pytest.raises(UsageError, match=r"\$HARDRANK_THREADS is 'two': set it to a thread count, a whole number "
                                         r"in 1\.\.\d+"):
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


def test_thread_counts_outside_one_to_four_per_cpu_are_refused_naming_the_option(monkeypatch):
    """--threads 100000 segfaulted while the model was built (issue 37): every thread-count option, the two
    environment overrides and the Python API take 1..4 x os.cpu_count() and say so."""
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 2)
    assert cpus.max_threads() == 8 and cpus.budget(8, probe=False).threads == 8
    ranged = "must be a whole number in 1..8 (at most 4 per CPU; this machine has 2), got "
    with pytest.raises(UsageError) as e:
        cpus.budget(9, probe=False)
    assert str(e.value) == "option threads (--threads) " + ranged + "9"
    for name in ("threads", "decode_threads"):
        with pytest.raises(UsageError) as e:
            EmbedOptions(**{name: 100000})
        assert str(e.value) == f"option {name} (--{name.replace('_', '-')}) " + ranged + "100000"
    assert EmbedOptions(threads=8, decode_threads=8).threads == 8
    monkeypatch.setenv("OMP_NUM_THREADS", "100000")
    with pytest.raises(UsageError, match=r"^\$OMP_NUM_THREADS is '100000': set it to a thread count, a whole "
                                         r"number in 1\.\.8 "):
        cpus.budget(probe=False)
    from hardrank.jobs.bench.options import KernelBenchConfig, PipelineBenchConfig
    with pytest.raises(UsageError, match=r"^option threads \(--threads\) must be a whole number in 1\.\.8 "):
        KernelBenchConfig(threads=64)
    with pytest.raises(UsageError, match=r"^option naive_workers \(--naive-workers\) must be a whole number in 0\.\.8"):
        PipelineBenchConfig(model="toy-clip", naive_workers=9)


def test_start_run_sizes_torch_and_returns_the_run_settings(monkeypatch, tmp_path):
    _fake_cgroup(monkeypatch, tmp_path, "0::/\n", {}, affinity=2)
    s = start_run(1)
    assert isinstance(s, RunSettings) and torch.get_num_threads() == 1 and (s.threads, s.decode_threads) == (1, 1)
    s = start_run(2, probe=False)
    assert torch.get_num_threads() == 2 and s.decode_threads == 2
    assert start_run(2, decode_threads=5).decode_threads == 5  # --decode-threads wins
    assert start_run(None, probe=False).budget.source == "cores"  # the last run's --threads 2 is not kept
    rec = start_run(2, probe=False).record()
    assert rec["threads"] == 2 and rec["description"].startswith("2 (--threads 2;") and rec["wait_policy"]
    with pytest.raises(AttributeError):
        s.budget = None  # frozen: a run's settings never change under it


def test_faiss_threads_follow_the_run_budget():
    """FAISS's OpenMP pool is sized at each index build and search to torch's threads, i.e. the budget of the
    run that searches (whatever ran before); nothing is registered at import. (Where FAISS and torch load one
    libgomp, as the PyPI wheels here do, the two counts are one setting anyway.)"""
    faiss_index = pytest.importorskip("hardrank.scoring.faiss_index")
    n = faiss_index.faiss.omp_get_max_threads()
    xb = np.eye(4, dtype=np.float32)
    try:
        for t in (1, 2, 1):
            start_run(t)
            index = faiss_index.FaissIndex(xb, "Flat", gpu=False)
            assert faiss_index.faiss.omp_get_max_threads() == t
            assert index.search(xb, 1)[1][:, 0].tolist() == [0, 1, 2, 3]
            assert faiss_index.faiss.omp_get_max_threads() == t
    finally:
        faiss_index.faiss.omp_set_num_threads(n)


def _ray_init_args(monkeypatch) -> dict:
    """What ``ray.init`` would be called with (Ray itself is not started)."""
    ray_embed = pytest.importorskip("hardrank.executors.ray_embed")
    got = {}
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_embed.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_embed.ray, "init", lambda **kw: got.update(kw))
    return got


def test_local_ray_cluster_gets_the_run_budget_as_its_cpus(monkeypatch):
    got = _ray_init_args(monkeypatch)
    ray_options = EmbedOptions(executor="ray")
    executor(ray_options, start_run(1)).embed_runner([])._connect()
    assert got["num_cpus"] == 1
    executor(ray_options, start_run(2)).embed_runner([])._connect()
    assert got["num_cpus"] == 2
    executor(EmbedOptions(executor="ray", threads=1)).embed_runner([])._connect()  # no settings: the options'
    assert got["num_cpus"] == 1


def _mine_identity(out, settings=None) -> dict:
    from hardrank.config import MineOptions
    from hardrank.mining.problem import MineProblem
    from hardrank.mining.run import mine_arrays

    x = np.eye(6, dtype=np.float32)
    problem = MineProblem(xq=x, xb=x, query_ids=[f"q{i}" for i in range(6)], corpus_ids=[f"c{i}" for i in range(6)],
                          modality="image", direction="i2i")
    return mine_arrays(problem, MineOptions(k=2, search="exact", dup_threshold=None, recall_sample=0), out,
                       settings=settings)


def test_two_runs_in_one_process_keep_their_own_budgets(tiny_world, tmp_path, monkeypatch):
    """A run with --threads 1, then runs in the same process with other budgets: each sizes torch, its decode
    threads, a local Ray cluster and its record from its own options, never from the run before (the budget
    used to live in a module global that later runs read: they got 1 thread, 1 decode thread, a 1-CPU cluster
    and a record saying --threads 1)."""
    assert _eval(tiny_world, tmp_path, 1)["provenance"]["threads"]["threads"] == 1
    seen = []

    def runner(work):  # what the stages get: torch's threads while they run, each job's decode threads
        seen.append((torch.get_num_threads(), [job.decode_threads for job, _ in work]))
        LocalRunner(pipe.models)(work)

    spec = hardrank.ModelSpec(str(tiny_world["cfg"]), str(tiny_world["ckpt"]), device="cpu")
    pipe = hardrank.EmbedPipeline([spec], EmbedOptions(store=str(tmp_path / "s2"), device="cpu", threads=2),
                                  runner=runner)
    tables = hardrank.Tables.empty()
    tables.images.add(hardrank.ImageRef(str(next(tiny_world["images"].rglob("*.jpg")))))
    tables.texts.add("a caption")
    pipe.run(tables)
    assert seen == [(2, [2, 2])]

    _eval(tiny_world, tmp_path, 1)
    got = _ray_init_args(monkeypatch)
    executor(EmbedOptions(executor="ray", threads=2)).embed_runner([])._connect()
    assert got["num_cpus"] == 2

    _eval(tiny_world, tmp_path, 1)
    summary = _mine_identity(tmp_path / "m1", start_run(2))
    assert summary["threads"]["threads"] == 2 and torch.get_num_threads() == 2
    _eval(tiny_world, tmp_path, 1)
    summary = _mine_identity(tmp_path / "m2")  # no settings: a run of its own, with mining's default budget
    assert summary["threads"]["source"] != "--threads"


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
