"""The Ray executor: embed jobs on long-lived Ray actors (decode actors -> K-checkpoint encoder actors)."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import ray
import torch

import hardrank.kernels
from hardrank import cpus
from hardrank.encoding.decode import image_size
from hardrank.encoding.job import DecodeStage, EmbedJob, EmbedSink, EncodeStage
from hardrank.errors import UsageError
from hardrank.models.load import load_model

__all__ = ["RayRunner", "ScanMapper", "connect"]

log = logging.getLogger("hardrank.ray")


def _shipped_package() -> str:
    """The ``hardrank`` package as one folder, for a remote cluster's workers (``py_modules``).
    An installed copy already is one; an editable checkout maps three folders (engine/, kernels/,
    jobs/) onto it, so they are copied together under a temporary ``hardrank/``."""
    pkg = Path(hardrank.__file__).resolve().parent
    kernels_dir = Path(hardrank.kernels.__file__).resolve().parent
    jobs_dir = Path(__file__).resolve().parent
    if kernels_dir.parent == pkg and jobs_dir.parent == pkg:
        return str(pkg)
    ignore = shutil.ignore_patterns("__pycache__", "*.safetensors", "*.pt")  # weights are read by path
    root = Path(tempfile.mkdtemp(prefix="hardrank-ship-")) / "hardrank"
    shutil.copytree(pkg, root, ignore=ignore)
    shutil.copytree(kernels_dir, root / "kernels", ignore=ignore)
    shutil.copytree(jobs_dir, root / "jobs", ignore=ignore)
    return str(root)


def connect(address: str | None = None, threads: int | None = None) -> bool:
    """Join the Ray cluster at ``address`` (else ``$RAY_ADDRESS``, else start a local one of ``threads`` CPUs:
    the run's thread budget; None: this process's, ``cpus.decide``), shipping this hardrank to remote
    workers. Returns whether this call initialised Ray (the caller then shuts it down); an already
    initialised Ray session is used as it is."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    # Ray's own lines (its warnings at start, its workers' and raylet's output relayed to this process)
    # follow hardrank's log level: shown with `-v` (INFO), else only Ray's errors; an actor's failure
    # still reaches the driver as the task's exception
    verbose = log.isEnabledFor(logging.INFO)
    quiet = {"logging_level": logging.INFO if verbose else logging.ERROR, "log_to_driver": verbose}
    with _keep_sigterm_handler():
        if address:  # ship this checkout's code so workers run exactly what the driver runs
            env = {"py_modules": [_shipped_package()], "excludes": ["*.safetensors", "*.pt", "__pycache__"]}
            try:
                ray.init(address=address, runtime_env=env, **quiet)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UsageError(f"could not join the Ray cluster at {address!r} ({exc}); check "
                                 f"--ray-address / $RAY_ADDRESS, or unset both to start a local cluster") from exc
        else:  # a local cluster's workers run this interpreter, which imports hardrank already; its CPUs are
            # the run's thread budget (affinity, cgroup quota, --threads), which sizes every actor's threads
            ray.init(num_cpus=threads or cpus.decide().threads, include_dashboard=False, **quiet)
    return True


@contextlib.contextmanager
def _keep_sigterm_handler():
    """``ray.init`` sets the driver's SIGTERM handler to ``sys.exit``: a Python handler installed before (the
    command line's, which flushes encoded embeddings and exits 143 with its message) is put back after it;
    without one, Ray's stays."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(before):
            signal.signal(signal.SIGTERM, before)


class RayRunner:
    """``runner(work)`` for ``EmbedPipeline``: runs ``EmbedJob``s on long-lived Ray actors.

    The runner owns its actors: created on its first call, reused by every later call until
    ``close()`` (or ``with``) kills them. So the entries of a job file (``jobs/grid.py`` keeps one
    runner per cluster address) and the passes of one run pay the worker start-up (processes,
    ``import torch, open_clip``: 5-70 s on 2 shared cores) once. Actors are configured per call from the job's
    configs, never from live models: a decoder is rebuilt only when the decode config changes, an
    encoder loads only the checkpoints it does not hold yet (dropping those the call does not use)
    and checks them against the driver's fingerprints. A call whose plan (actor counts, GPU or not)
    differs from the pools' re-creates them.

    Two layouts. With GPUs (or ``decode_actors`` / ``encode_actors`` given): decode actors (Pillow
    or DALI) feed encoder actors that hold all K checkpoints (one per GPU, ``num_gpus=1``); each
    decoded batch travels as an object ref from decoder to encoder, never through the driver. On a
    CPU-only cluster by default: one actor per node decodes and encodes, two batches at a time (one
    decoding while the other encodes, as the in-process executor does), so no pixels cross
    processes and no extra processes compete for the cores.

    One task is one encoder batch of the job (``job.batches()``), so every checkpoint sees exactly
    the batches the in-process executor would encode: the embeddings are identical for the same
    decoder. The driver keeps at most ``inflight`` batches per actor (decoded batches waiting for an
    encoder are bounded too, which bounds memory) and writes results to the stores as they finish
    (``ray.wait``), in any order; the sink commits an atomic shard every ``flush_rows`` rows, so a
    killed run keeps its work. An actor that dies is restarted and its batches are retried (up to 3
    times each).

    Actors reserve no logical CPUs (``num_cpus=0``, spread over the nodes): idle pools must not
    starve the Ray tasks and actors that other parts of a run start on the same cluster (tar-shard
    scans, sharded ranking or mining). The plan still sizes them from the cluster's CPUs and sets
    their threads.

    address: a Ray cluster to join (default ``$RAY_ADDRESS``; neither: start a local cluster of ``threads``
    CPUs, the run's thread budget). An already initialised Ray session in this process is used as it is.
    """

    def __init__(self, address: str | None = None, *, threads: int | None = None, decode_actors: int | None = None,
                 encode_actors: int | None = None, inflight: int = 2):
        for name, v in (("decode_actors", decode_actors), ("encode_actors", encode_actors), ("inflight", inflight)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise UsageError(f"RayRunner {name} must be a positive int or None, got {v!r}")
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.threads = threads
        self.decode_actors, self.encode_actors, self.inflight = decode_actors, encode_actors, inflight
        self._owned = False
        self._pools: dict[str, tuple] = {}  # "decode" | "encode" | "embed" -> (key, [actor handles])

    # -- cluster -------------------------------------------------------------------------
    def _connect(self) -> None:
        self._owned = connect(self.address, self.threads) or self._owned

    def close(self) -> None:
        """Kill the runner's actors, and shut Ray down if this runner started or joined it."""
        for name in list(self._pools):
            self._drop(name)
        if self._owned and ray.is_initialized():
            ray.shutdown()
        self._owned = False

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- actors --------------------------------------------------------------------------
    def _drop(self, name: str) -> None:
        _, actors = self._pools.pop(name, (None, []))
        if ray.is_initialized():
            for a in actors:
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)

    def _pool(self, name: str, cls, n: int, **options) -> list:
        """The pool ``name``: ``n`` actors of ``cls`` (Ray ``options`` besides the restart policy and no CPU
        reservation), reused while ``(cls, n, options)`` stay the same, re-created when they change."""
        key = (cls, n, tuple(sorted(options.items())))
        if name in self._pools and self._pools[name][0] != key:
            self._drop(name)
        if name not in self._pools:
            actor = ray.remote(cls).options(num_cpus=0, **_RESTART, **options)
            self._pools[name] = (key, [actor.remote() for _ in range(n)])
        return self._pools[name][1]

    def workers(self) -> dict[str, list[dict]]:
        """The live actors' ``{"pid", "node", "loads"}`` per pool ("decode" and "encode", or "embed");
        ``loads`` counts the checkpoints an encoder has loaded since it started."""
        return {name: ray.get([a.info.remote() for a in actors]) for name, (_, actors) in self._pools.items()}

    # -- running -------------------------------------------------------------------------
    def __call__(self, work: list[tuple[EmbedJob, EmbedSink]]) -> None:
        _run(work, self)

    def _plan(self, image_job: EmbedJob | None, specs: tuple) -> dict:
        """The pools' sizes and threads for this cluster (a call with fewer batches uses fewer actors)."""
        res = ray.cluster_resources()
        cpus, gpus = max(1, int(res.get("CPU", 1))), int(res.get("GPU", 0))
        gpu = gpus > 0 and all(s.device == "auto" or s.device.startswith("cuda") for s in specs)
        if not gpu and self.decode_actors is None and self.encode_actors is None:
            # CPU only: one process per node decodes and encodes, as the in-process executor does (no
            # pixels between processes, no extra processes competing for the cores)
            nodes = max(1, sum(1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")))
            per = max(1, cpus // nodes)
            return {"gpu": False, "fused": True, "n_enc": nodes, "n_dec": 0, "dec_threads": per, "enc_threads": per}
        n_enc = max(1, self.encode_actors or (gpus if gpu else 1))
        # a decoder per core, less one per GPU encoder to feed it; on CPUs the encoder shares the cores
        # with the decoders, as the in-process executor's threads do
        n_dec = max(1, self.decode_actors or max(1, cpus - (n_enc if gpu else 0)))
        threads = image_job.decode_threads if image_job else 1
        return {"gpu": gpu, "fused": False, "n_enc": n_enc, "n_dec": n_dec, "dec_threads": max(1, threads // n_dec),
                "enc_threads": 0 if gpu else max(1, cpus // n_enc)}


# A crashed actor is restarted (its constructor takes no arguments: every task carries its config)
# and the batches it held are retried, a few times each: a batch that keeps killing its worker fails
# the run instead of looping (pinned by tests/test_ray_dali.py).
_RESTART = {"max_restarts": -1, "max_task_retries": 3}


class ScanMapper:
    """``mapper(fn, items, *args)`` for ``hardrank.inputs.scan_with``: one Ray task per item (a tar
    shard), so the cluster's workers read the shards (no shared filesystem needed when they are URLs)
    and the driver receives only their member lists and captions."""

    def __init__(self, address: str | None = None, threads: int | None = None):
        self.address, self.threads = address, threads
        self._owned = False

    def __call__(self, fn, items, *args):
        items = list(items)
        if not items:
            return []
        self._owned = connect(self.address, self.threads) or self._owned
        task = ray.remote(num_cpus=0.5)(fn)
        return ray.get([task.remote(x, *args) for x in items])

    def close(self) -> None:
        if self._owned and ray.is_initialized():
            ray.shutdown()
        self._owned = False


def _sources(work: list[tuple[EmbedJob, EmbedSink]]) -> list[tuple[dict, EmbedSink]]:
    """Every source batch (``job.batches()``) with its sink, texts first (they are quick)."""
    return [(b, sink) for job, sink in sorted(work, key=lambda w: w[0].modality != "text") for b in job.batches()]


def _light(job: EmbedJob | None) -> EmbedJob | None:
    """What actors need: the job's configs, not its rows."""
    return None if job is None else dataclasses.replace(job, rows=np.zeros(0, np.int64), items=())


def _run(work: list[tuple[EmbedJob, EmbedSink]], runner: RayRunner, decode_cls=None, embed_cls=None) -> None:
    """Run ``work`` on ``runner``'s actors; ``decode_cls`` replaces the decode actor class (and picks the
    split layout), ``embed_cls`` the fused actor class (tests: a new pool either way)."""
    jobs = {job.modality: job for job, _ in work}
    if not jobs:
        return
    image_job, text_job = _light(jobs.get("image")), _light(jobs.get("text"))
    specs = next(iter(jobs.values())).specs
    runner._connect()
    source = _sources(work)
    n_img = sum(1 for b, _ in source if b["modality"] == "image")
    plan = runner._plan(image_job, specs)
    log.info("ray executor: %d batches, plan %s", len(source), plan)
    t0 = time.perf_counter()
    fused = plan["fused"] and decode_cls is None
    if fused:
        encoders = runner._pool("embed", embed_cls or _EmbedActor, plan["n_enc"], max_concurrency=2,
                                scheduling_strategy="SPREAD")
    else:
        encoders = runner._pool("encode", _EncodeActor, plan["n_enc"], num_gpus=1 if plan["gpu"] else 0,
                                scheduling_strategy="DEFAULT" if plan["gpu"] else "SPREAD")
    encoders = encoders[:len(source)]
    decoders = runner._pool("decode", decode_cls or _DecodeActor, plan["n_dec"],
                            scheduling_strategy="SPREAD")[:n_img] if n_img and not fused else []
    dec_job, enc_job = ray.put(image_job), ray.put(image_job or text_job)  # once per call, not per batch
    sinks = {id(s): s for _, s in source}
    pending = collections.deque(source)
    ready: collections.deque = collections.deque()  # (batch or decoded ref, sink): waiting for an encoder
    decoding: dict = {}  # ref -> (decoder index, sink)
    encoding: dict = {}  # ref -> (encoder index, sink)
    dec_busy, enc_busy = [0] * len(decoders), [0] * len(encoders)
    cap = runner.inflight + fused  # a fused actor runs two batches at once (one decodes, one encodes): one queued
    ahead = cap * (len(encoders) + len(decoders))  # decoded or decoding batches not yet on an encoder
    try:
        while pending or ready or decoding or encoding:
            while pending and (fused or pending[0][0]["modality"] == "text"):  # no separate decoding
                ready.append(pending.popleft())
            while pending and min(dec_busy) < cap and len(ready) + len(decoding) < ahead:
                batch, sink = pending.popleft()
                i = dec_busy.index(min(dec_busy))
                decoding[decoders[i].decode.remote(dec_job, plan["dec_threads"], batch)] = (i, sink)
                dec_busy[i] += 1
            while ready and min(enc_busy) < cap:
                batch, sink = ready.popleft()
                i = enc_busy.index(min(enc_busy))
                if fused:
                    ref = encoders[i].embed.remote(dec_job, enc_job, plan["dec_threads"], plan["enc_threads"], batch)
                else:
                    ref = encoders[i].encode.remote(enc_job, plan["enc_threads"], batch)
                encoding[ref] = (i, sink)
                enc_busy[i] += 1
            refs = [*decoding, *encoding]
            ray.wait(refs, num_returns=1, fetch_local=False)
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
            for ref in done:
                if ref in decoding:  # its ref goes to an encoder: the pixels never pass through here
                    i, sink = decoding.pop(ref)
                    dec_busy[i] -= 1
                    ready.append((ref, sink))
                    continue
                i, sink = encoding.pop(ref)
                enc_busy[i] -= 1
                out = ray.get(ref)
                sink.time("decode_actor", out.pop("decode_s"))
                sink.time("encode_actor", out.pop("encode_s"))
                sink.deliver(out)
    except ray.exceptions.RayActorError:
        for name in ("decode", "encode", "embed"):  # past its retries: the next call starts new actors
            runner._drop(name)
        raise
    # on other errors (too many failures, an interrupt) the batches still queued on the actors run to
    # their end and are dropped; the actors stay usable
    elapsed = time.perf_counter() - t0
    for sink in sinks.values():
        sink.time("ray", elapsed)
        sink.stats.seconds += elapsed


class _DecodeActor:
    """Decode actor: source batch -> decoded batch (pixels as numpy, which Ray hands over without a
    copy). The decoder is built from the job's configs and rebuilt only when they change."""

    def __init__(self):
        self.stage, self.key = None, None

    def info(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "loads": 0}

    def decode(self, job: EmbedJob, threads: int, batch: dict) -> dict:
        key = (json.dumps(job.preprocess_cfg, sort_keys=True, default=str), job.decoder, job.batch_size,
               job.key_by, threads)
        if key != self.key:
            self.stage, self.hw, self.key = DecodeStage(job, threads), image_size(job.preprocess_cfg), key
        t = time.perf_counter()
        d = self.stage(batch)
        n = len(batch["rows"])
        px = d.get("pixels")  # a tensor, or a dict of a processor's arrays (SigLIP 2): each as numpy
        d["pixels"] = {k: v.numpy() for k, v in px.items()} if isinstance(px, dict) else \
            px.numpy() if px is not None else np.zeros((0, 3, *self.hw), np.float32)
        d["decode_s"] = time.perf_counter() - t
        d.setdefault("ok", np.ones(n, dtype=bool))
        d["error"] = d.get("error") or [None] * n
        return d


class _EncodeActor:
    """Encoder actor holding the call's K checkpoints (loaded from the job's specs, checked against
    the driver's fingerprints, kept until the specs change): batch -> K embedding arrays."""

    def __init__(self):
        self.stage, self.key, self.models, self.loads = None, None, {}, 0

    def info(self) -> dict:
        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "loads": self.loads}

    def encode(self, job: EmbedJob, threads: int, batch: dict) -> dict:
        key = (tuple(map(repr, job.specs)), tuple(job.fingerprints), threads)
        if key != self.key:
            models = {}
            for s in job.specs:
                k = repr(s)
                if k not in models:
                    models[k] = self.models.get(k)
                    if models[k] is None:
                        models[k], self.loads = load_model(s), self.loads + 1
            self.models = models  # checkpoints of earlier calls that this one lacks are freed
            self.stage = EncodeStage(job, [models[repr(s)] for s in job.specs], threads=threads)
            self.key = key
        px = batch.get("pixels")
        if isinstance(px, np.ndarray) or isinstance(px, dict) and all(isinstance(v, np.ndarray) for v in px.values()):
            with warnings.catch_warnings():  # Ray's zero-copy arrays are read-only; the encoder only reads them
                warnings.simplefilter("ignore", UserWarning)
                batch["pixels"] = {k: torch.from_numpy(v) for k, v in px.items()} if isinstance(px, dict) else \
                    torch.from_numpy(px)
        t = time.perf_counter()
        e = self.stage(batch)
        k = self.stage.k
        return {"rows": e["rows"], "ok": e["ok"], "error": e["error"], "keys": e.get("keys"),
                "emb": list(e["emb"]) if e["emb"] else [None] * k,
                "decode_s": float(batch.get("decode_s", 0.0)), "encode_s": time.perf_counter() - t}


class _EmbedActor:
    """Decode and encode in one process (CPU-only clusters, one per node): two batches at a time
    (``max_concurrency=2``), one decoding while the other encodes, as the in-process executor's
    prefetch thread; a lock per stage keeps each stage single-file."""

    def __init__(self):
        self.dec, self.enc = _DecodeActor(), _EncodeActor()
        self.dec_lock, self.enc_lock = threading.Lock(), threading.Lock()

    def info(self) -> dict:
        return self.enc.info()

    def embed(self, dec_job: EmbedJob | None, enc_job: EmbedJob, dec_threads: int, enc_threads: int,
              batch: dict) -> dict:
        if batch["modality"] == "image":
            with self.dec_lock:
                batch = self.dec.decode(dec_job, dec_threads, batch)
        with self.enc_lock:
            return self.enc.encode(enc_job, enc_threads, batch)
