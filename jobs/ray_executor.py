"""The Ray executor: embed jobs on Ray Data actor pools (decode actors -> K-checkpoint encoder actors)."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
import ray.data
import torch

import hardrank.kernels
from hardrank.embed import DecodeStage, EmbedJob, EmbedSink, EncodeStage, image_size
from hardrank.items import ImageRef

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


def connect(address: str | None = None) -> bool:
    """Join the Ray cluster at ``address`` (else ``$RAY_ADDRESS``, else start a local one), shipping this
    hardrank to remote workers. Returns whether this call initialised Ray (the caller then shuts it
    down); an already initialised Ray session is used as it is."""
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:  # ship this checkout's code so workers run exactly what the driver runs
        env = {"py_modules": [_shipped_package()], "excludes": ["*.safetensors", "*.pt", "__pycache__"]}
        try:
            ray.init(address=address, runtime_env=env, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ValueError(f"could not join the Ray cluster at {address!r} ({exc}); check "
                             f"--ray-address / $RAY_ADDRESS, or unset both to start a local cluster") from exc
    else:  # a local cluster's workers run this interpreter, which imports hardrank already
        ray.init(include_dashboard=False, logging_level=logging.WARNING)
    return True


class RayRunner:
    """``runner(work)`` for ``EmbedPipeline``: runs ``EmbedJob``s on one Ray Data pipeline.

    One Ray row is one encoder batch of the job (``job.batches()``), so every checkpoint sees
    exactly the batches the in-process executor would encode: the embeddings are identical for
    the same decoder. Decode actors (Pillow or DALI, CPU) feed encoder actors that each hold all K
    checkpoints (one per GPU, ``num_gpus=1``; one on a CPU-only cluster) and return one embedding
    column per checkpoint. The driver writes results to the stores as they stream in
    (``iter_batches``), and the sink commits an atomic shard every ``flush_rows`` rows, so a killed
    run keeps its work. Actors are built from the job's configs, never from live models, and are
    restarted (and their task retried) if they die. Ray Data's streaming back-pressure bounds
    memory: at most ``inflight`` batches per actor are queued.

    address: a Ray cluster to join (default ``$RAY_ADDRESS``; neither: start a local cluster).
    An already initialised Ray session in this process is used as it is.
    """

    def __init__(self, address: str | None = None, *, decode_actors: int | None = None,
                 encode_actors: int | None = None, inflight: int = 2):
        for name, v in (("decode_actors", decode_actors), ("encode_actors", encode_actors), ("inflight", inflight)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"RayRunner {name} must be a positive int or None, got {v!r}")
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.decode_actors, self.encode_actors, self.inflight = decode_actors, encode_actors, inflight
        self._owned = False

    # -- cluster -------------------------------------------------------------------------
    def _connect(self) -> None:
        self._owned = connect(self.address) or self._owned

    def close(self) -> None:
        """Shut Ray down if this runner started or joined it."""
        if self._owned and ray.is_initialized():
            ray.shutdown()
        self._owned = False

    def __enter__(self) -> RayRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running -------------------------------------------------------------------------
    def __call__(self, work: list[tuple[EmbedJob, EmbedSink]]) -> None:
        _run(work, self)

    def _plan(self, image_job: EmbedJob | None, specs: tuple, n_batches: int, n_image_batches: int) -> dict:
        res = ray.cluster_resources()
        cpus, gpus = max(1, int(res.get("CPU", 1))), int(res.get("GPU", 0))
        gpu = gpus > 0 and all(s.device == "auto" or s.device.startswith("cuda") for s in specs)
        n_enc = max(1, min(self.encode_actors or (gpus if gpu else 1), n_batches))
        n_dec = max(1, min(self.decode_actors or max(1, cpus - (n_enc if gpu else 0)), n_image_batches))
        # Every actor must fit at once, or the encoder waits for the decoders to finish (no
        # streaming). On a CPU-only cluster the encoder shares the cores with the decoders, as the
        # in-process executor's threads do; with a GPU it keeps one core to feed it.
        enc_cpus = 1.0 if gpu else 0.5
        dec_cpus = max(0.25, min(1.0, (cpus - enc_cpus * n_enc) / n_dec))
        threads = image_job.decode_threads if image_job else 1
        return {"gpu": gpu, "n_enc": n_enc, "n_dec": n_dec, "enc_cpus": enc_cpus, "dec_cpus": dec_cpus,
                "dec_threads": max(1, threads // n_dec), "enc_threads": 0 if gpu else max(1, cpus // n_enc)}


class ScanMapper:
    """``mapper(fn, items, *args)`` for ``hardrank.sources.scan_with``: one Ray task per item (a tar
    shard), so the cluster's workers read the shards (no shared filesystem needed when they are URLs)
    and the driver receives only their member lists and captions."""

    def __init__(self, address: str | None = None):
        self.address = address
        self._owned = False

    def __call__(self, fn, items, *args):
        items = list(items)
        if not items:
            return []
        self._owned = connect(self.address) or self._owned
        task = ray.remote(num_cpus=0.5)(fn)
        return ray.get([task.remote(x, *args) for x in items])

    def close(self) -> None:
        if self._owned and ray.is_initialized():
            ray.shutdown()
        self._owned = False


@contextlib.contextmanager
def _data_context():
    """Quiet, row-preserving Ray Data settings for one run; the caller's settings come back after.
    Settings an older Ray lacks (``print_on_execution_start`` is newer than 2.10) are left alone."""
    ctx = ray.data.DataContext.get_current()
    quiet = [k for k in ("enable_progress_bars", "enable_auto_log_stats", "print_on_execution_start")
             if hasattr(ctx, k)]
    old = {k: getattr(ctx, k) for k in (*quiet, "target_max_block_size")}
    for k in quiet:
        setattr(ctx, k, False)
    # One row (one encoder batch of pixels) may exceed the default block size; never split rows.
    ctx.target_max_block_size = max(ctx.target_max_block_size or 0, 1 << 30)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(ctx, k, v)


def _source(work: list[tuple[EmbedJob, EmbedSink]]) -> list[dict]:
    """One Ray row per source batch (``job.batches()``), texts first (they are quick). The items
    travel as JSON: images as [uri, crop or null], texts as strings."""
    out = []
    for job, _ in sorted(work, key=lambda w: w[0].modality != "text"):
        for b in job.batches():
            items = b["items"]
            if job.modality == "image":
                items = [[r.uri, list(r.crop) if r.crop is not None else None] for r in items]
            out.append({"batch": len(out), "modality": job.modality, "rows": _pack(b["rows"]),
                        "items": json.dumps(items), "models": json.dumps(list(b["models"]))})
    return out


def _light(job: EmbedJob | None) -> EmbedJob | None:
    """What actors need: the job's configs, not its rows."""
    return None if job is None else dataclasses.replace(job, rows=np.zeros(0, np.int64), items=())


def _run(work: list[tuple[EmbedJob, EmbedSink]], runner: RayRunner, decode_cls=None) -> None:
    """Run ``work`` on one Ray Data pipeline; ``decode_cls`` replaces the decode actor class."""
    jobs = {job.modality: job for job, _ in work}
    sinks = {job.modality: sink for job, sink in work}
    if not jobs:
        return
    image_job, text_job = _light(jobs.get("image")), _light(jobs.get("text"))
    specs = next(iter(jobs.values())).specs
    runner._connect()
    source = _source(work)
    n_img = sum(1 for b in source if b["modality"] == "image")
    plan = runner._plan(image_job, specs, len(source), n_img)
    log.info("ray executor: %d batches, plan %s", len(source), plan)
    t0 = time.perf_counter()
    with _data_context():
        # Ray Data actor pools default to max_restarts=-1, max_task_retries=-1: a crashed actor is
        # restarted and its batch redone (pinned by tests/test_ray_dali.py).
        ds = ray.data.from_items(source, override_num_blocks=len(source))  # a block per batch, no metadata tasks
        if image_job is not None:
            ds = ds.map_batches(decode_cls or _DecodeActor, fn_constructor_args=(image_job, plan["dec_threads"]),
                                batch_size=1, batch_format="numpy", num_cpus=plan["dec_cpus"],
                                compute=ray.data.ActorPoolStrategy(size=plan["n_dec"],
                                                                   max_tasks_in_flight_per_actor=runner.inflight))
        ds = ds.map_batches(_EncodeActor, fn_constructor_args=(image_job or text_job, plan["enc_threads"]),
                            batch_size=1, batch_format="numpy", num_gpus=1 if plan["gpu"] else 0,
                            num_cpus=plan["enc_cpus"],
                            compute=ray.data.ActorPoolStrategy(size=plan["n_enc"],
                                                               max_tasks_in_flight_per_actor=runner.inflight))
        k = len(specs)
        for out in ds.iter_batches(batch_size=None, batch_format="numpy"):  # streams as batches finish
            for j in range(len(out["batch"])):
                sink = sinks[str(out["modality"][j])]
                models = set(json.loads(out["models"][j]))  # the checkpoints that encoded this batch
                sink.deliver({"rows": _unpack(out["rows"][j]), "ok": _unpack(out["ok"][j]),
                              "error": json.loads(out["error"][j]),
                              "keys": json.loads(out["keys"][j]) if "keys" in out else None,
                              "emb": [_unpack(out[f"emb{i}"][j]) if i in models else None for i in range(k)]})
                sink.time("decode_actor", float(out["decode_s"][j]))
                sink.time("encode_actor", float(out["encode_s"][j]))
    elapsed = time.perf_counter() - t0
    for sink in sinks.values():
        sink.time("ray", elapsed)
        sink.stats.seconds += elapsed


def _batch(rows: dict, j: int) -> dict:
    """Ray row j as the stages' batch dict (see hardrank.embed.job)."""
    modality = str(rows["modality"][j])
    items = json.loads(rows["items"][j])
    if modality == "image":
        items = [ImageRef(u, None if c is None else tuple(c)) for u, c in items]
    b = {"modality": modality, "rows": _unpack(rows["rows"][j]), "items": items,
         "models": tuple(json.loads(rows["models"][j]))}
    if "ok" in rows:
        b["ok"] = _unpack(rows["ok"][j])
        b["error"] = json.loads(rows["error"][j])
        if "keys" in rows:  # content keys the decode actor hashed (--key-by id)
            b["keys"] = json.loads(rows["keys"][j])
        if modality == "image":
            b["pixels"] = torch.from_numpy(_unpack(rows["pixels"][j]))  # (n, 3, H, W) float32
    return b


class _DecodeActor:
    """Ray Data UDF around the decode stage: Ray rows (one source batch each) -> decoded rows."""

    def __init__(self, job: EmbedJob, threads: int):
        self.stage = DecodeStage(job, threads)
        self.hw = image_size(job.preprocess_cfg)

    def __call__(self, rows: dict) -> dict:
        out = {c: [] for c in ("batch", "modality", "rows", "items", "models", "pixels", "ok", "error", "keys",
                               "decode_s")}
        for j in range(len(rows["batch"])):
            b = _batch(rows, j)
            t = time.perf_counter()
            d = self.stage(b)
            out["decode_s"].append(time.perf_counter() - t)
            n = len(b["rows"])
            pixels = d["pixels"].numpy() if "pixels" in d else np.zeros((0, 3, *self.hw), np.float32)
            for c, v in (("batch", rows["batch"][j]), ("modality", rows["modality"][j]), ("rows", b["rows"]),
                         ("items", rows["items"][j]), ("models", rows["models"][j]),
                         ("pixels", pixels),  # (n, 3, H, W) float32
                         ("ok", d.get("ok", np.ones(n, dtype=bool))),
                         ("error", json.dumps(d.get("error") or [None] * n)),
                         ("keys", json.dumps(d.get("keys")))):
                out[c].append(v)
        return _stack(out)


class _EncodeActor:
    """Ray Data UDF around the encode stage, holding all K checkpoints (loaded from the job's specs
    and checked against the driver's fingerprints): decoded rows -> ``emb0..emb{K-1}``."""

    def __init__(self, job: EmbedJob, threads: int):
        self.stage = EncodeStage(job, threads=threads)

    def __call__(self, rows: dict) -> dict:
        k = self.stage.k
        out = {c: [] for c in ("batch", "modality", "rows", "models", "ok", "error", "keys", "decode_s", "encode_s")}
        out.update({f"emb{i}": [] for i in range(k)})
        for j in range(len(rows["batch"])):
            b = _batch(rows, j)
            if "ok" not in b:  # texts when no image decode stage ran
                b["ok"], b["error"] = np.ones(len(b["rows"]), dtype=bool), [None] * len(b["rows"])
            t = time.perf_counter()
            e = self.stage(b)
            out["encode_s"].append(time.perf_counter() - t)
            for c, v in (("batch", rows["batch"][j]), ("modality", rows["modality"][j]), ("rows", e["rows"]),
                         ("models", rows["models"][j]), ("ok", e["ok"]), ("error", json.dumps(e["error"])),
                         ("keys", json.dumps(e.get("keys"))),
                         ("decode_s", float(rows["decode_s"][j]) if "decode_s" in rows else 0.0)):
                out[c].append(v)
            for i in range(k):  # checkpoints that did not encode the batch send an empty array
                emb = e["emb"][i] if e["emb"] else None
                out[f"emb{i}"].append(emb if emb is not None else np.zeros((0, 1), np.float32))
        return _stack(out)


def _pack(a: np.ndarray) -> bytes:
    """An array as .npy bytes. Per-row arrays travel as bytes, not as Ray tensor columns: their
    shapes differ from row to row, and Ray's variable-shaped tensor columns fail to concatenate in
    some Ray releases; bytes are plain Arrow binary in every one."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _unpack(b: bytes) -> np.ndarray:
    return np.load(io.BytesIO(b), allow_pickle=False)


def _stack(cols: dict) -> dict:
    """Per-row values -> a numpy batch: arrays are packed to bytes, held (like all bytes) in object
    arrays (a fixed-width bytes array would drop trailing zero bytes)."""
    out = {}
    for name, vals in cols.items():
        vals = [_pack(v) if isinstance(v, np.ndarray) else v for v in vals]
        if vals and isinstance(vals[0], bytes):
            arr = np.empty(len(vals), dtype=object)
            arr[:] = vals
            out[name] = arr
        else:
            out[name] = np.asarray(vals)
    return out
