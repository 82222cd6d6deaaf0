"""Training dashboards: each checkpoint's headline metrics logged at its step to TensorBoard, W&B or MLflow.

``--log-to tensorboard:DIR`` writes TensorBoard event files under DIR; ``--log-to wandb:PROJECT`` a
Weights & Biases run of that project (offline unless ``WANDB_MODE`` says otherwise: no network; ``wandb
sync`` uploads it later); ``--log-to mlflow:URI`` an MLflow run at that tracking URI (a folder or
``file:`` URI is a local file store). Each is an optional extra, imported here only, when asked for. The
step is the one in the checkpoint's name (``epoch_3``, ``checkpoint-500``, ``step0200``:
``hardrank.models.runs.checkpoint_step``); the metrics are the terminal table's, named
``<suite>/<column>`` (``toy-rococo/i2t R@1``; MLflow allows no ``@`` in a name: ``toy-rococo/i2t R_at_1``).
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from pathlib import Path

from hardrank.config import LOGGERS, LogTarget, parse_log_to
from hardrank.errors import MissingExtra
from hardrank.models.runs import checkpoint_step
from hardrank.scoring.results import summary_row

__all__ = ["LogTarget", "parse_log_to", "Dashboards", "LOGGERS", "metric_name"]

log = logging.getLogger("hardrank.dashboards")

MLFLOW_EXPERIMENT = "hardrank"


def metric_name(suite: str, column: str, *, mlflow: bool = False) -> str:
    """``<suite>/<column>``; for MLflow (names of letters, digits, ``_-. :/`` only) ``@`` is ``_at_`` and any
    other character outside those ``_``."""
    name = f"{suite}/{column}"
    if mlflow:
        name = re.sub(r"[^A-Za-z0-9_\-. :/]", "_", name.replace("@", "_at_"))
    return name


def _step(result: dict) -> int:
    found = checkpoint_step(str(result.get("checkpoint", "")))
    return found[1] if found is not None else 0


def _import(kind: str):
    extra = LOGGERS[kind][1]
    try:
        if kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
            return SummaryWriter
        if kind == "wandb":
            import wandb
            return wandb
        from mlflow.tracking import MlflowClient
        return MlflowClient
    except ImportError as exc:
        raise MissingExtra(f"--log-to {kind}:...", extra, extra) from exc


class _TensorBoard:
    def __init__(self, where: str, run: str):
        self._writer = _import("tensorboard")(log_dir=where)

    def log(self, step: int, checkpoint: str, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _WandB:
    def __init__(self, where: str, run: str):
        wandb = _import("wandb")
        self._own = wandb.run is None or wandb.run.project != where
        if self._own:  # a run of its own, resumed by id when the same results folder logs again
            run_id = hashlib.blake2b(f"{where}\0{run}".encode(), digest_size=8).hexdigest()
            self._run = wandb.init(project=where, name=Path(run).name or "hardrank", id=run_id, resume="allow",
                                   mode=os.environ.get("WANDB_MODE") or "offline", reinit="create_new",
                                   config={"hardrank_results": run})
        else:  # the caller's own run (a training loop's): logged into, left open
            self._run = wandb.run
        self._run.define_metric("checkpoint_step")
        self._run.define_metric("*", step_metric="checkpoint_step")

    def log(self, step: int, checkpoint: str, metrics: dict[str, float]) -> None:
        self._run.log({**metrics, "checkpoint_step": step})

    def close(self) -> None:
        if self._own:
            self._run.finish()


class _MLflow:
    def __init__(self, where: str, run: str):
        client_cls = _import("mlflow")
        if "://" not in where and not where.startswith("file:"):
            where = Path(where).resolve().as_uri()
        if where.startswith("file:"):  # MLflow 3 asks file-store users to opt in; asked for one, we do
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = c = client_cls(tracking_uri=where)
        exp = c.get_experiment_by_name(MLFLOW_EXPERIMENT)
        exp_id = exp.experiment_id if exp is not None else c.create_experiment(MLFLOW_EXPERIMENT)
        found = c.search_runs([exp_id], filter_string=f"tags.hardrank_results = '{run}'", max_results=1)
        self._run_id = found[0].info.run_id if found else c.create_run(
            exp_id, run_name=Path(run).name or "hardrank", tags={"hardrank_results": run}).info.run_id

    def log(self, step: int, checkpoint: str, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


_OPEN = {"tensorboard": _TensorBoard, "wandb": _WandB, "mlflow": _MLflow}


class Dashboards:
    """The loggers ``--log-to`` names, opened at once (a missing package fails before any work): ``log(result)``
    logs one result's headline metrics at its checkpoint's step; ``close()`` finishes every run. ``run`` names
    the run (the results folder: W&B and MLflow resume the run of the same folder)."""

    def __init__(self, specs, run: str):
        self.targets = [parse_log_to(s) for s in specs]
        self._loggers = []
        try:
            for t in self.targets:
                self._loggers.append((t.kind, _OPEN[t.kind](t.where, str(Path(run).resolve()))))
        except BaseException:
            self.close()
            raise

    def log(self, result: dict) -> None:
        """One result's headline numbers (``summary_row``) at its checkpoint's step."""
        if not self._loggers:
            return
        suite = str(result.get("suite"))
        row = {k: float(v) for k, v in summary_row(result).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v}
        if checkpoint_step(str(result.get("checkpoint", ""))) is None:
            log.warning("checkpoint %s has no step in its name: its metrics are logged at step 0",
                        result.get("checkpoint"))
        for kind, logger in self._loggers:
            logger.log(_step(result), str(result.get("checkpoint")),
                       {metric_name(suite, k, mlflow=kind == "mlflow"): v for k, v in row.items()})

    def close(self) -> None:
        while self._loggers:
            self._loggers.pop()[1].close()

    def __enter__(self) -> Dashboards:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
