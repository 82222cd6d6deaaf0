"""The naive baseline the bench times: Pillow + DataLoader, one checkpoint at a time, a full score matrix per view."""
from __future__ import annotations

import signal
import sys

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from hardrank.embed import image_size, make_transform
from hardrank.items import Tables, decode_image
from hardrank.jobs.bench.options import PipelineBenchConfig
from hardrank.jobs.bench.timing import Clock
from hardrank.kernels.reference import naive_rank
from hardrank.models.load import load_model
from hardrank.models.runs import user_specs
from hardrank.scoring.metrics import choice_metrics
from hardrank.suites import load_suites

__all__ = ["NaivePipeline", "naive_loader", "view_slice"]


class _ImageList(Dataset):
    """Pillow decode + the model's transform, one item at a time (in DataLoader workers)."""

    def __init__(self, refs, transform, size: tuple[int, int]):
        self.refs, self.transform, self.size = refs, transform, size

    def __len__(self):
        return len(self.refs)

    def __getitem__(self, i):
        try:
            return self.transform(decode_image(self.refs[i]))
        except Exception:  # the naive tools crash here; we keep going so the timing finishes
            return torch.zeros(3, *self.size)


_STOPS = {signal.SIGTERM, signal.SIGINT}


def _leave_stopping_to_the_parent(worker_id: int) -> None:
    """A DataLoader worker ignores SIGTERM and SIGINT. A stop sent to the whole process group (Slurm, systemd,
    `timeout`, Ctrl-C) reaches the workers too; dying of it, they made torch's SIGCHLD handler raise "DataLoader
    worker is killed by signal" into the parent's cleanup, a 100-line traceback instead of the one line. The
    parent stops them itself when its loader goes (and a worker whose parent is gone exits: torch's watchdog)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _quiet_fd_sharing(previous):
    """A ``sys.excepthook`` that drops a connection error of multiprocessing's fd-sharing thread (the thread that
    hands a DataLoader worker's tensors to this process; its server loop reports errors through
    ``sys.excepthook``): a worker ended mid-handshake while the command stops, and that thread printed a
    traceback beside the one line (seen under load). Anything else goes to ``previous``."""
    def hook(exc_type, exc, tb):
        frames, at = [], tb
        while at is not None:
            frames.append(at.tb_frame.f_code.co_filename)
            at = at.tb_next
        if issubclass(exc_type, (ConnectionError, EOFError)) and any(  # raised in its server loop
                f.endswith("multiprocessing/resource_sharer.py") for f in frames):
            return
        previous(exc_type, exc, tb)
    hook.quiet_fd_sharing = True
    return hook


class _Loader(DataLoader):
    """A DataLoader whose workers are forked with SIGTERM and SIGINT blocked, so a stop arriving before a
    worker has run ``_leave_stopping_to_the_parent`` waits (and is then dropped) instead of killing it;
    the parent's own block lifts once they are started, and a stop that came meanwhile is handled then."""

    def __iter__(self):
        if not self.num_workers:
            return super().__iter__()
        if not getattr(sys.excepthook, "quiet_fd_sharing", False):
            sys.excepthook = _quiet_fd_sharing(sys.excepthook)
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            return super().__iter__()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def naive_loader(refs, transform, preprocess_cfg: dict, batch_size: int, workers: int) -> DataLoader:
    """Batches ``(B, 3, H, W)`` of the model's pixels, decoded one item at a time in ``workers``
    DataLoader processes (0: in this process)."""
    return _Loader(_ImageList(refs, transform, image_size(preprocess_cfg)), batch_size=batch_size, shuffle=False,
                   num_workers=workers, worker_init_fn=_leave_stopping_to_the_parent if workers else None)


def view_slice(t, view: str):
    """Gallery positions of one view of a ranking task, and its positives remapped into them (CSR)."""
    gi = sorted(t.groups.index(g) for g in t.views[view])
    pos = np.concatenate([np.arange(t.group_bounds[g], t.group_bounds[g + 1]) for g in gi])
    remap = np.full(len(t.gallery_items), -1, dtype=np.int64)
    remap[pos] = np.arange(len(pos))
    p = remap[t.pos_idx]
    keep = p >= 0
    ptr = np.concatenate([[0], np.cumsum(keep)])[t.pos_ptr]
    return pos, ptr, p[keep]


class NaivePipeline:
    """One checkpoint at a time: per (suite, task, view) a dataset of the view's queries and gallery,
    encoded from scratch (Pillow + DataLoader, tokenised per checkpoint), then the full score matrix.
    Each step's seconds and items go to ``clock``."""

    def __init__(self, cfg: PipelineBenchConfig, clock: Clock):
        self.cfg, self.clock = cfg, clock
        self.batch_size = cfg.embed.batch_size

    def _images(self, model, transform, refs):
        out = []
        it = iter(naive_loader(refs, transform, model.preprocess_cfg, self.batch_size, self.cfg.loader_workers))
        while True:
            with self.clock("decode+preprocess", 0):
                x = next(it, None)
            if x is None:
                break
            self.clock.n["decode+preprocess"] += len(x)
            with self.clock("image encode", len(x)), torch.inference_mode():
                e = model.model.encode_image(x.to(model.device, model.dtype)).float()
                out.append(torch.nn.functional.normalize(e, dim=-1))
        return torch.cat(out) if out else torch.zeros(0, model.embed_dim, device=model.device)

    def _texts(self, model, texts):
        out = []
        for s in range(0, len(texts), self.batch_size):
            batch = texts[s:s + self.batch_size]
            with self.clock("tokenise", len(batch)):
                tok = model.tokenizer(batch)
            with self.clock("text encode", len(batch)), torch.inference_mode():
                e = model.model.encode_text(tok.to(model.device)).float()
                out.append(torch.nn.functional.normalize(e, dim=-1))
        return torch.cat(out) if out else torch.zeros(0, model.embed_dim, device=model.device)

    def _encode(self, model, transform, modality, entries):
        return self._images(model, transform, entries) if modality == "image" else self._texts(model, entries)

    def run(self) -> dict:
        """Metrics per checkpoint label: {(suite, view, task): R@1} and the choice accuracies."""
        cfg = self.cfg
        out = {}
        for ckpt in cfg.checkpoints:
            with self.clock("model load", 1):
                no_weights = ckpt is None and not cfg.pretrained
                (spec,) = user_specs(cfg.model, (ckpt,), precision=cfg.embed.precision, device=cfg.embed.device,
                                     pretrained=cfg.pretrained, random_init=no_weights)
                model = load_model(spec)
            with self.clock("suite load"):
                tables = Tables.empty()
                suites = load_suites(list(cfg.suites), tables, cfg.suite_options)
            transform = make_transform(model.preprocess_cfg)
            res = out.setdefault(model.label, {})
            for suite in suites:
                for t in suite.ranking:
                    qt, gt = tables.of(t.query_modality), tables.of(t.gallery_modality)
                    for view in t.views:
                        pos, ptr, idx = view_slice(t, view)
                        xq = self._encode(model, transform, t.query_modality, [qt.entries[r] for r in t.query_items])
                        xb = self._encode(model, transform, t.gallery_modality,
                                          [gt.entries[r] for r in t.gallery_items[pos]])
                        with self.clock("rank", t.num_queries):
                            rank, _ = naive_rank(xq.float(), xb.float(), ptr, idx)
                            res[(suite.name, view, t.name)] = 100.0 * float((rank < 1).float().mean())
                for t in suite.choice:
                    lt, rt = tables.of(t.left_modality), tables.of(t.right_modality)
                    xl = self._encode(model, transform, t.left_modality, [lt.entries[r] for r in t.left.ravel()])
                    xr = self._encode(model, transform, t.right_modality, [rt.entries[r] for r in t.right.ravel()])
                    with self.clock("choice score", len(t.ids)):
                        n, a, b = len(t.ids), t.left.shape[1], t.right.shape[1]
                        s = torch.einsum("nad,nbd->nab", xl.view(n, a, -1), xr.view(n, b, -1))
                        m, _ = choice_metrics(t, s.cpu().numpy())
                    res[(suite.name, "all", t.name)] = m["all"]
            del model
        return out
