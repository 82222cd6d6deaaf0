"""The one place that decides how many threads a run computes with, and sizes this process's pools to it.

Cores this process may use = min(CPU affinity, cgroup CPU quota); the threads a run uses = an explicit
``--threads`` / ``$HARDRANK_THREADS`` / ``$OMP_NUM_THREADS``, else those cores, less the ones a few
other processes keep busy at the start of the run (not on a saturated machine: see ``budget``). More
threads than free cores is not a small loss: every parallel region (a GEMM, a top-k tile) waits for its
slowest thread, and a thread the scheduler parked behind a neighbour holds the whole region for a
scheduler time slice (milliseconds), so a run's time follows its op count, not its work (issue 29: a
4-checkpoint toy eval 37.4 s beside one busy process, 10.4 s with one thread). Results never depend on
the thread count (tests/test_cpus.py pins that).

This module keeps no run's budget: ``decide`` returns one (a frozen ``ThreadBudget``), ``apply`` sizes
torch's pools to it, and the run hands it down (``hardrank.settings.RunSettings``); FAISS's own OpenMP
pool follows torch's at each use (``hardrank.scoring.faiss_index``). Its one effect at import is the
OpenMP wait policy below.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from hardrank.errors import UsageError
from hardrank.openmp import TORCH_FIRST as _TORCH_FIRST  # the wait policy: set before torch's import

__all__ = ["ThreadBudget", "budget", "decide", "apply", "use", "max_threads", "check_threads", "wait_policy",
           "cgroup_quota", "probe_cores"]

# where the kernel says what this process may use (module-level so tests can point them at fakes)
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_STAT = Path("/proc/stat")
IDLE_SAMPLE_S = 0.2   # long enough for a few scheduler ticks per core (100-1000 Hz), short beside a run
ENV_OVERRIDES = ("HARDRANK_THREADS", "OMP_NUM_THREADS")  # in this order, after --threads
THREADS_PER_CPU = 4   # the most threads of any pool per CPU of the machine: past that, only start-up cost and
                      # crashes (--threads 100000 segfaulted while the model was built: issue 37)


def max_threads() -> int:
    """The most threads any thread-count option takes: ``THREADS_PER_CPU`` per CPU of this machine
    (``os.cpu_count()``), e.g. 8 on 2 CPUs."""
    return THREADS_PER_CPU * (os.cpu_count() or 1)


def threads_range(lowest: int = 1) -> str:
    """The allowed range in words, for messages: ``1..8 (at most 4 per CPU; this machine has 2)``."""
    return f"{lowest}..{max_threads()} (at most {THREADS_PER_CPU} per CPU; this machine has {os.cpu_count() or 1})"


def check_threads(value, what: str = "option threads (--threads)", lowest: int = 1) -> int:
    """``value`` as a count of threads (or worker processes) in ``lowest..max_threads()``; else a UsageError
    naming ``what``, the value and the range (an ``opt(check=...)`` of ``hardrank.config``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= max_threads():
        raise UsageError(f"{what} must be a whole number in {threads_range(lowest)}, got {value!r}")
    return value


@dataclass(frozen=True)
class ThreadBudget:
    """How many threads each pool of this process gets, and why."""

    threads: int               # torch intra-op threads, decode threads (capped), FAISS OpenMP threads
    cores: int                 # cores this process may use: min(affinity, quota)
    affinity: int              # CPUs in this process's affinity mask
    quota: float | None        # cgroup CPU quota in cores (None: no quota)
    source: str                # what chose it: --threads, $HARDRANK_THREADS, $OMP_NUM_THREADS, cores, idle cores,
                               # saturated
    idle: float | None = None  # idle cores of the affinity set at start (None: not measured)
    runnable: float | None = None  # other tasks runnable on the whole system at start (None: not measured)

    def describe(self) -> str:
        """One line for logs and summaries, e.g. ``2 (affinity 2, quota none)``."""
        quota = "none" if self.quota is None else f"{self.quota:g}"
        if self.source == "saturated":
            why = f"saturated at start: {self.runnable:g} other tasks runnable, fewer threads would only cede time; "
        elif self.source in ("cores", "idle cores"):
            why = "" if self.idle is None else f"{self.idle:.1f} of {self.cores} cores idle at start; "
        else:
            why = f"{self.source} {self.threads}; "
        return f"{self.threads} ({why}affinity {self.affinity}, quota {quota})"

    def record(self) -> dict:
        return {**asdict(self), "description": self.describe(), "wait_policy": wait_policy()}


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity mask
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _quota_files() -> list[tuple[Path, str]]:
    """(file, "v2" | "v1") candidates holding this process's CPU quota: its own cgroup's (and its
    ancestors', whose limits also bind) and the mount root's (in a container the cgroup path named in
    /proc/self/cgroup is often the host's, and the container sees its own cgroup at the root)."""
    out = []
    for line in (_read(PROC_SELF_CGROUP) or "").splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        rel = Path(path.lstrip("/"))
        chain = [rel, *rel.parents] if str(rel) not in ("", ".") else [Path()]
        if controllers == "":  # cgroup v2 unified hierarchy
            out += [(CGROUP_ROOT / p / "cpu.max", "v2") for p in chain]
        elif "cpu" in controllers.split(","):
            for d in dict.fromkeys((controllers, "cpu", "cpu,cpuacct")):
                out += [(CGROUP_ROOT / d / p / "cpu.cfs_quota_us", "v1") for p in chain]
    return out


def cgroup_quota() -> float | None:
    """The tightest cgroup CPU quota over this process's cgroups, in cores (1.5 = 150 ms per 100 ms);
    None when there is none (``max`` / ``-1``) or no cgroup file is readable."""
    best = None
    for f, kind in _quota_files():
        text = _read(f)
        if not text:
            continue
        if kind == "v2":
            quota, _, period = text.partition(" ")
        else:
            quota, period = text, _read(f.with_name("cpu.cfs_period_us")) or ""
        try:
            q, p = int(quota), int(period)
        except ValueError:  # "max": no limit
            continue
        if q > 0 and p > 0:
            best = q / p if best is None else min(best, q / p)
    return best


def _override(threads: int | None) -> tuple[int, str] | None:
    if threads is not None:
        return check_threads(threads), "--threads"
    for name in ENV_OVERRIDES:
        v = os.environ.get(name, "").strip()
        if not v:
            continue
        if not v.isdigit() or not 1 <= int(v) <= max_threads():
            raise UsageError(f"${name} is {v!r}: set it to a thread count, a whole number in {threads_range()}, "
                             f"or unset it")
        return int(v), f"${name}"
    return None


def _stat(cpus: set[int]) -> tuple[int, int, int, int] | None:
    """From /proc/stat: (idle, total) jiffies summed over ``cpus``, the tasks runnable right now on the
    whole system (``procs_running``, this one included) and the CPUs online; None where it cannot be read."""
    text = _read(PROC_STAT)
    if text is None:
        return None
    idle = total = seen = online = running = 0
    for line in text.splitlines():
        name, *vals = line.split() or [""]
        if name == "procs_running":
            running = int(vals[0])
        if not name.startswith("cpu") or name == "cpu":
            continue
        online += 1
        if int(name[3:]) in cpus:
            v = [int(x) for x in vals[:8]]  # user nice system idle iowait irq softirq steal
            idle += v[3] + v[4]
            total += sum(v)
            seen += 1
    return (idle, total, running, online) if seen else None


def probe_cores(seconds: float = IDLE_SAMPLE_S, reads: int = 5) -> tuple[float, float, int] | None:
    """(idle cores of this process's affinity set over ``seconds``, other tasks runnable meanwhile on the
    whole system (mean of ``reads`` looks, this thread not counted), CPUs online), read from /proc/stat
    while this thread sleeps: e.g. (1.0, 1.0, 2) on 2 cores beside one CPU-bound process; None where unknown."""
    try:
        cpus = os.sched_getaffinity(0)
    except AttributeError:
        return None
    looks = [_stat(cpus)]
    for _ in range(reads - 1):
        time.sleep(seconds / (reads - 1))
        looks.append(_stat(cpus))
    a, b = looks[0], looks[-1]
    if a is None or b is None or b[1] <= a[1]:
        return None
    others = sum(x[2] for x in looks if x) / sum(1 for x in looks if x) - 1
    return len(cpus) * (b[0] - a[0]) / (b[1] - a[1]), max(0.0, others), b[3]


def budget(threads: int | None = None, *, probe: bool = True) -> ThreadBudget:
    """The thread budget of this process: ``threads`` (``--threads``), else ``$HARDRANK_THREADS``, else
    ``$OMP_NUM_THREADS``, else the cores it may use (min of affinity and cgroup quota, rounded up); when
    ``probe``, one ``IDLE_SAMPLE_S`` look at /proc/stat first takes off the cores a few other processes
    keep busy (one CPU-bound neighbour on 2 cores: 1 thread, no straggler for every parallel region to
    wait on). A saturated machine (as many runnable tasks as CPUs, or more) keeps all the cores: the
    scheduler then shares each core between threads, so fewer threads only give time away (2 cores at
    load 17: exact search 24.7 s with 1 thread, 5.6 s with 2; benchmarks/bench_contention.py). A
    neighbour that starts later is not seen; ``--threads`` is the fix then."""
    affinity, quota = _affinity(), cgroup_quota()
    cores = max(1, min(affinity, math.ceil(quota) if quota is not None else affinity))
    chosen = _override(threads)
    if chosen is not None:
        return ThreadBudget(chosen[0], cores, affinity, quota, chosen[1])
    seen = probe_cores() if probe and cores > 1 else None
    if seen is None:
        return ThreadBudget(cores, cores, affinity, quota, "cores")
    idle, others, online = seen
    if others >= online:
        return ThreadBudget(cores, cores, affinity, quota, "saturated", round(idle, 2), round(others, 1))
    n = max(1, min(cores, math.floor(idle + 0.5)))  # a core counts as free when over half of it was idle
    return ThreadBudget(n, cores, affinity, quota, "cores" if n == cores else "idle cores", round(idle, 2),
                        round(others, 1))


# A cache of the machine, not of a run: when and what the last look at the idle cores saw (the budget it gave).
_PROBED: tuple[float, ThreadBudget] | None = None
PROBE_REUSE_S = 30.0  # runs started within this of the last look reuse it (watch, grids, many calls in one process)


def decide(threads: int | None = None, *, probe: bool = True) -> ThreadBudget:
    """A run's budget (``budget``), sizing nothing: a look at the idle cores taken less than ``PROBE_REUSE_S``
    ago is reused (0.2 s each, it adds up over many calls in one process). An explicit count is never probed."""
    global _PROBED
    b = budget(threads, probe=False)
    if probe and b.source == "cores" and b.cores > 1:  # no override: look at the idle cores, or reuse a recent look
        last = _PROBED
        if last is None or time.monotonic() - last[0] > PROBE_REUSE_S or \
                (last[1].cores, last[1].affinity, last[1].quota) != (b.cores, b.affinity, b.quota):
            last = _PROBED = (time.monotonic(), budget(threads))
        b = last[1]
    return b


def apply(b: ThreadBudget) -> ThreadBudget:
    """Size this process's torch pools to ``b`` (they are torch's, process-wide): its intra-op threads, and its
    inter-op threads while they have not started (torch allows setting them once, before first use). FAISS's
    OpenMP pool follows torch's at each index build and search (``hardrank.scoring.faiss_index``); decode pools
    and Ray actors get their counts handed down with the run's ``RunSettings``. Returns ``b``."""
    torch.set_num_threads(b.threads)
    try:
        torch.set_num_interop_threads(b.threads)
    except RuntimeError:  # already started, or set once before: it stays as it is
        pass
    return b


def use(threads: int | None = None, *, probe: bool = True) -> ThreadBudget:
    """``apply(decide(threads, probe=probe))``: what a script that is its own run calls first (the engine's
    entry points call ``hardrank.settings.start_run``, which also fixes the decode threads)."""
    return apply(decide(threads, probe=probe))


def wait_policy() -> str:
    """How idle OpenMP threads of this process wait: ``PASSIVE`` (sleep: what ``import hardrank`` sets
    before torch loads libgomp, which reads it once), the user's own setting, or ``spin`` when torch was
    imported before hardrank (libgomp had read the environment already: unless the user set a policy
    before that, its threads spin 300,000 rounds between regions)."""
    if _TORCH_FIRST:
        return "spin (torch was imported before hardrank: import hardrank first, or set OMP_WAIT_POLICY=PASSIVE)"
    return os.environ.get("OMP_WAIT_POLICY", "unset")
