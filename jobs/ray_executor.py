"""The Ray executor: embed jobs on Ray Data actor pools (decode actors -> K-checkpoint encoder actors)."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import ray
import ray.data

import hardrank.kernels
from hardrank.embed import EmbedJob, EmbedSink

__all__ = ["RayRunner"]

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


class RayRunner:
    """``runner(work)`` for ``embed_tables`` / ``evaluate``: runs ``EmbedJob``s on one Ray Data pipeline.

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
        if ray.is_initialized():
            return
        if self.address:  # ship this checkout's code so workers run exactly what the driver runs
            env = {"py_modules": [_shipped_package()], "excludes": ["*.safetensors", "*.pt", "__pycache__"]}
            try:
                ray.init(address=self.address, runtime_env=env, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ValueError(f"could not join the Ray cluster at {self.address!r} ({exc}); check "
                                 f"--ray-address / $RAY_ADDRESS, or unset both to start a local cluster") from exc
        else:  # a local cluster's workers run this interpreter, which imports hardrank already
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
        self._owned = True

    def close(self) -> None:
        """Shut Ray down if this runner started or joined it."""
        if self._owned and ray.is_initialized():
            ray.shutdown()
        self._owned = False

    def __enter__(self) -> "RayRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- running -------------------------------------------------------------------------
    def __call__(self, work: list[tuple[EmbedJob, EmbedSink]]) -> None:
        _run(work, self, _DecodeActor)

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


@contextlib.contextmanager
def _data_context():
    """Quiet, row-preserving Ray Data settings for one run; the caller's settings come back after."""
    ctx = ray.data.DataContext.get_current()
    keys = ("enable_progress_bars", "enable_auto_log_stats", "print_on_execution_start", "target_max_block_size")
    old = {k: getattr(ctx, k) for k in keys}
    ctx.enable_progress_bars = ctx.enable_auto_log_stats = ctx.print_on_execution_start = False
    # One row (one encoder batch of pixels) may exceed the default block size; never split rows.
    ctx.target_max_block_size = max(ctx.target_max_block_size or 0, 1 << 30)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(ctx, k, v)


def _source(work: list[tuple[EmbedJob, EmbedSink]]) -> list[dict]:
    """One Ray row per encoder batch, texts first (they are quick). The items travel as JSON:
    images as [uri, crop or null], texts as strings."""
    out = []
    for job, _ in sorted(work, key=lambda w: w[0].modality != "text"):
        for rows, items in job.batches():
            if job.modality == "image":
                payload = [[r.uri, list(r.crop) if r.crop is not None else None] for r in items]
            else:
                payload = list(items)
            out.append({"batch": len(out), "modality": job.modality, "rows": rows.tolist(),
                        "items": json.dumps(payload)})
    return out


def _light(job: EmbedJob | None) -> EmbedJob | None:
    """What actors need: the job's configs, not its rows."""
    return None if job is None else dataclasses.replace(job, rows=np.zeros(0, np.int64), items=())


def _run(work: list[tuple[EmbedJob, EmbedSink]], runner: RayRunner, decode_cls) -> None:
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
    with _data_context():
        # Ray Data actor pools default to max_restarts=-1, max_task_retries=-1: a crashed actor is
        # restarted and its batch redone (pinned by tests/test_ray_dali.py).
        ds = ray.data.from_items(source, override_num_blocks=len(source))  # a block per batch, no metadata tasks
        if image_job is not None:
            ds = ds.map_batches(decode_cls, fn_constructor_args=(image_job, plan["dec_threads"]), batch_size=1,
                                batch_format="numpy", num_cpus=plan["dec_cpus"],
                                compute=ray.data.ActorPoolStrategy(size=plan["n_dec"],
                                                                   max_tasks_in_flight_per_actor=runner.inflight))
        ds = ds.map_batches(_EncodeActor, fn_constructor_args=(image_job, text_job, plan["enc_threads"]),
                            batch_size=1, batch_format="numpy", num_gpus=1 if plan["gpu"] else 0,
                            num_cpus=plan["enc_cpus"],
                            compute=ray.data.ActorPoolStrategy(size=plan["n_enc"],
                                                               max_tasks_in_flight_per_actor=runner.inflight))
        k = len(specs)
        t0 = time.perf_counter()
        for out in ds.iter_batches(batch_size=None, batch_format="numpy"):  # streams as batches finish
            for j in range(len(out["batch"])):
                sink = sinks[str(out["modality"][j])]
                rows = np.asarray(out["rows"][j], dtype=np.int64)
                ok = np.asarray(out["ok"][j], dtype=bool)
                if not ok.all():
                    errors = json.loads(out["error"][j])
                    sink.fail(rows[~ok], [e for e, good in zip(errors, ok) if not good])
                if ok.any():
                    sink.add(rows[ok], [np.asarray(out[f"emb{i}"][j])[ok] for i in range(k)])
                sink.time("decode_actor", float(out["decode_s"][j]))
                sink.time("encode_actor", float(out["encode_s"][j]))
    for sink in sinks.values():
        sink.time("ray", time.perf_counter() - t0)


class _DecodeActor:
    """Ray Data UDF: image batch rows -> pixels (n, 3, H, W), ok, error; text rows pass through."""

    def __init__(self, job: EmbedJob, threads: int):
        self.stage = dataclasses.replace(job, decode_threads=threads).decoder_stage()
        size = job.preprocess_cfg.get("size", 224)
        self.hw = (size, size) if isinstance(size, int) else tuple(size)

    def __call__(self, batch: dict) -> dict:
        from hardrank.items import ImageRef

        out = {c: [] for c in ("batch", "modality", "rows", "items", "pixels", "ok", "error", "decode_s")}
        for j in range(len(batch["batch"])):
            rows = np.asarray(batch["rows"][j], dtype=np.int64)
            for c in ("batch", "modality", "items"):
                out[c].append(batch[c][j])
            out["rows"].append(rows)
            if batch["modality"][j] != "image":
                out["pixels"].append(np.zeros((0, 3, *self.hw), np.float32))
                out["ok"].append(np.ones(len(rows), dtype=bool))
                out["error"].append("[]")
                out["decode_s"].append(0.0)
                continue
            refs = [ImageRef(u, None if c is None else tuple(c)) for u, c in json.loads(batch["items"][j])]
            t = time.perf_counter()
            d = self.stage({"ref": refs})
            out["decode_s"].append(time.perf_counter() - t)
            out["pixels"].append(d["pixels"].numpy())  # (n, 3, H, W) float32
            out["ok"].append(np.asarray(d["ok"], dtype=bool))
            out["error"].append(json.dumps(d["error"]))
        return _stack(out)


class _EncodeActor:
    """Ray Data UDF holding all K checkpoints: a batch row -> ``emb0..emb{K-1}`` (n, D) each."""

    def __init__(self, image_job: EmbedJob | None, text_job: EmbedJob | None, threads: int):
        import torch

        from hardrank.embed import ImageEncoder, TextEncoder
        from hardrank.models import load_model

        job = image_job or text_job
        if threads:
            torch.set_num_threads(threads)
        models = [load_model(s) for s in job.specs]
        for m, fp in zip(models, job.fingerprints):
            if m.fingerprint != fp:
                raise RuntimeError(f"worker built model {m.fingerprint} but the driver expects {fp} "
                                   f"({m.spec.checkpoint}): the worker runs a different open_clip/hardrank "
                                   f"or sees a different file")
        self.dims = [m.embed_dim for m in models]
        self.image, self.text = ImageEncoder(models), TextEncoder(models)

    def __call__(self, batch: dict) -> dict:
        import torch

        k = len(self.dims)
        out = {c: [] for c in ("batch", "modality", "rows", "ok", "error", "decode_s", "encode_s")}
        out.update({f"emb{i}": [] for i in range(k)})
        for j in range(len(batch["batch"])):
            rows = np.asarray(batch["rows"][j], dtype=np.int64)
            n = len(rows)
            embs = [np.zeros((n, d), dtype=np.float32) for d in self.dims]
            ok = np.asarray(batch["ok"][j], dtype=bool) if "ok" in batch else np.ones(n, dtype=bool)
            t = time.perf_counter()
            sel = np.nonzero(ok)[0]
            if batch["modality"][j] == "image" and len(sel):
                with warnings.catch_warnings():  # read-only Arrow buffer; the encoder never writes to it
                    warnings.simplefilter("ignore", UserWarning)
                    pixels = torch.from_numpy(np.ascontiguousarray(batch["pixels"][j]))
                # exactly what the in-process executor feeds: the batch minus its failures
                enc = self.image({"pixels": pixels if len(sel) == n else pixels[torch.from_numpy(sel)]})
            elif len(sel):
                enc = self.text({"text": json.loads(batch["items"][j])})
            for i in range(k if len(sel) else 0):
                embs[i][sel] = enc[f"emb{i}"]
            out["encode_s"].append(time.perf_counter() - t)
            for c in ("batch", "modality"):
                out[c].append(batch[c][j])
            out["rows"].append(rows)
            out["ok"].append(ok)
            out["error"].append(str(batch["error"][j]) if "error" in batch else "[]")
            out["decode_s"].append(float(batch["decode_s"][j]) if "decode_s" in batch else 0.0)
            for i in range(k):
                out[f"emb{i}"].append(embs[i])
        return _stack(out)


def _stack(cols: dict) -> dict:
    """Per-row values -> a numpy batch; per-row arrays and lists become object arrays of arrays."""
    out = {}
    for name, vals in cols.items():
        if vals and isinstance(vals[0], (np.ndarray, list)):
            arr = np.empty(len(vals), dtype=object)
            for i, v in enumerate(vals):
                arr[i] = v if isinstance(v, list) else np.asarray(v)
            out[name] = arr
        else:
            out[name] = np.asarray(vals)
    return out
