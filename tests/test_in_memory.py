"""Model objects in the Python API: an open_clip model (with its tokenizer and eval transform) or a transformers
dual encoder (with its processor) evaluated without files, exactly as the same weights from files, with the store
used only under a fingerprint the caller gives, and the caller's model left exactly as it was found."""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from helpers import make_karpathy_world, write_tiny_config

import hardrank
from hardrank.errors import UsageError
from hardrank.models.openclip import resolve_arch
from hardrank.store.embedding_store import open_store

open_clip = pytest.importorskip("open_clip")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("inmem")
    w = make_karpathy_world(root / "w", n_images=8)
    w["cfg"] = write_tiny_config(root)
    w["name"] = resolve_arch(str(w["cfg"]))
    return w


def _open_clip(world, seed: int = 0):
    """(model, train transform, eval transform, tokenizer) as a training script makes them."""
    torch.manual_seed(seed)
    model, train_tf, eval_tf = open_clip.create_model_and_transforms(world["name"])
    return model, train_tf, eval_tf, open_clip.get_tokenizer(world["name"])


def _run(world, tmp_path, out: str, **kw):
    """RoCOCO on the stand-in world (text and image variants): every path a checkpoint's embeddings take."""
    return hardrank.evaluate(suites=["rococo"], annotations=str(world["annotations"]), images=str(world["images"]),
                             image_variants=["mix_0.9"], seeds=[1], device="cpu", batch_size=7, bootstrap=0,
                             out=str(tmp_path / out), **kw)


def _store_rows(root) -> dict:
    """{modality: {key: embedding}} of the one fingerprint folder under ``root``."""
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    store = open_store(folder)
    return {m: dict(zip(store.keys(m), store.read(m, store.keys(m)))) for m in ("image", "text")}


def _state(model: torch.nn.Module) -> dict:
    return {"modes": {n: m.training for n, m in model.named_modules()},
            "grad_flags": {n: p.requires_grad for n, p in model.named_parameters()},
            "grads": {n: p.grad for n, p in model.named_parameters()},
            "places": {n: (t.device, t.dtype) for n, t in model.state_dict().items()},
            "values": {n: t.clone() for n, t in model.state_dict().items()}}


def _same_state(a: dict, b: dict) -> None:
    assert a["modes"] == b["modes"] and a["grad_flags"] == b["grad_flags"] and a["places"] == b["places"]
    assert all(b["grads"][n] is None for n in b["grads"])
    assert all(torch.equal(a["values"][n], b["values"][n]) for n in a["values"])


def test_an_open_clip_object_scores_and_embeds_exactly_as_its_checkpoint_file(world, tmp_path):
    from safetensors.torch import save_file

    model, _, eval_tf, tok = _open_clip(world, seed=3)
    ckpt = tmp_path / "step4000.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt))
    file = _run(world, tmp_path, "file", model=str(world["cfg"]), checkpoints=[str(ckpt)], store=str(tmp_path / "sf"))
    live = _run(world, tmp_path, "live", model=model, tokenizer=tok, preprocess=eval_tf, fingerprint="run1-step4000",
                store=str(tmp_path / "sl"))
    (f,), (g,) = file.results, live.results
    assert g["metrics"] == f["metrics"] and g["counts"] == f["counts"]
    assert g["checkpoint"] == "run1-step4000" and g["model"].startswith("<in-memory open_clip.model.CLIP")
    assert g["model_fingerprint"].startswith("run1-step4000-fp32-")
    cols = ["task", "view", "query_id", "rank", "top1_id", "correct"]
    assert pq.read_table(tmp_path / "live" / "run1-step4000" / "rococo.parquet", columns=cols).equals(
        pq.read_table(tmp_path / "file" / "step4000" / "rococo.parquet", columns=cols))
    a, b = _store_rows(tmp_path / "sf"), _store_rows(tmp_path / "sl")
    for m in ("image", "text"):
        assert a[m].keys() == b[m].keys() and len(a[m]) > 0
        assert all((a[m][k] == b[m][k]).all() for k in a[m]), m  # bit for bit
    # the same fingerprint again: every embedding from the store, nothing encoded
    again = _run(world, tmp_path, "live2", model=model, tokenizer=tok, fingerprint="run1-step4000",
                 store=str(tmp_path / "sl"))
    assert again.embed_stats["image"]["encoded"] == 0 and again.embed_stats["text"]["encoded"] == 0
    assert again.results[0]["metrics"] == f["metrics"]


def test_without_a_fingerprint_no_store_is_read_or_written(world, tmp_path):
    model, _, _, tok = _open_clip(world, seed=3)
    store = tmp_path / "store"
    plan = hardrank.plan(model=model, tokenizer=tok, store=str(store), suites=["rococo"], out=str(tmp_path / "p"),
                         annotations=str(world["annotations"]), images=str(world["images"]), device="cpu")
    (row,) = plan["checkpoints"]
    assert row["fingerprint"] is None and row["image_hits"] == 0 and row["image_to_encode"] == row["image_unique"] > 0
    rep = _run(world, tmp_path, "a", model=model, tokenizer=tok, store=str(store))
    assert not store.exists() and rep.results[0]["model_fingerprint"] is None
    assert rep.results[0]["checkpoint"] == "in-memory" and rep.embed_stats["image"]["from_store"] == 0
    # a store already holding this model's embeddings (under a fingerprint) is not read either, nor changed
    stored = _run(world, tmp_path, "b", model=model, tokenizer=tok, store=str(store), fingerprint="s")
    assert stored.results[0]["metrics"] == rep.results[0]["metrics"]  # memory and a store folder give the same
    before = sorted((p, p.stat().st_mtime_ns) for p in store.rglob("*"))
    rep2 = _run(world, tmp_path, "c", model=model, tokenizer=tok, store=str(store))
    assert rep2.embed_stats["image"]["from_store"] == 0 and rep2.embed_stats["image"]["encoded"] > 0
    assert sorted((p, p.stat().st_mtime_ns) for p in store.rglob("*")) == before
    assert rep2.results[0]["metrics"] == rep.results[0]["metrics"]


def test_the_callers_model_is_left_exactly_as_it_was_found(world, tmp_path):
    """Training mode (mixed per submodule), requires_grad flags, device and dtype, values, and no .grad; the model
    encodes in eval mode without autograd; and all of it holds when the evaluation fails half way."""
    model, _, eval_tf, tok = _open_clip(world, seed=5)
    model.train()
    model.visual.transformer.resblocks[0].eval()  # a frozen block, as fine-tuning leaves some
    model.logit_scale.requires_grad_(False)
    model.token_embedding.weight.requires_grad_(False)
    seen = []
    hook = model.visual.register_forward_hook(
        lambda mod, args, out: seen.append((mod.training, torch.is_grad_enabled(), torch.is_inference_mode_enabled())))
    before = _state(model)
    _run(world, tmp_path, "a", model=model, tokenizer=tok, preprocess=eval_tf)
    _same_state(before, _state(model))
    assert seen and all(s == (False, False, True) for s in seen)

    def failing(texts):  # a tokenizer that breaks on one caption of the suite, mid-run
        if any("number 5" in t for t in ([texts] if isinstance(texts, str) else texts)):
            raise RuntimeError("tokenizer broke")
        return tok(texts)

    with pytest.raises(RuntimeError, match="tokenizer broke"):
        _run(world, tmp_path, "b", model=model, tokenizer=failing)
    hook.remove()
    _same_state(before, _state(model))
    assert model.training and not model.visual.transformer.resblocks[0].training


def test_a_transformers_object_with_its_processor_equals_its_save_pretrained_folder(tmp_path):
    pytest.importorskip("transformers")
    from hf_helpers import clip_objects

    w = make_karpathy_world(tmp_path / "w", n_images=6)
    model, processor = clip_objects(seed=1)
    folder = tmp_path / "clip"
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    model.train()
    before = _state(model)
    run = dict(suites=["karpathy"], annotations=str(w["annotations"]), images=str(w["images"]), device="cpu",
               bootstrap=0, batch_size=5)
    file = hardrank.evaluate(model=f"hf:{folder}", out=str(tmp_path / "of"), store=str(tmp_path / "sf"), **run)
    live = hardrank.evaluate(model=model, processor=processor, fingerprint="ft-1", out=str(tmp_path / "ol"),
                             store=str(tmp_path / "sl"), **run)
    assert live.results[0]["metrics"] == file.results[0]["metrics"]
    a, b = _store_rows(tmp_path / "sf"), _store_rows(tmp_path / "sl")
    for m in ("image", "text"):
        # not bit for bit: transformers 5's from_pretrained keeps the safetensors file's memory-mapped tensors as
        # the folder model's parameters, at the offsets the file gives them (not 64-byte aligned), and a one-row
        # GEMM on such operands takes another kernel path on this CPU (1 ulp apart); the same weights in RAM match
        assert a[m].keys() == b[m].keys() and all(np.allclose(a[m][k], b[m][k], rtol=0, atol=1e-6) for k in a[m]), m
    _same_state(before, _state(model))
    # its image processor and tokenizer given apart work alike; without them, one line saying what to pass
    alike = hardrank.evaluate(model=model, preprocess=processor.image_processor, tokenizer=processor.tokenizer,
                              out=str(tmp_path / "o2"), **run)
    assert alike.results[0]["metrics"] == file.results[0]["metrics"]
    with pytest.raises(UsageError, match="needs its processor: processor=") as e:
        hardrank.evaluate(model=model, out=str(tmp_path / "o3"), **run)
    assert len(str(e.value).splitlines()) == 1


def test_what_cannot_go_with_a_model_object_is_refused_in_one_line_before_anything_is_encoded(world, tmp_path):
    model, train_tf, _, tok = _open_clip(world)
    cases = [(dict(model=model), "needs its tokenizer"),
             (dict(model=model, tokenizer=tok, preprocess=train_tf), "is not model <in-memory open_clip.model.CLIP>'s "
                                                                     "eval transform"),
             (dict(model=model, tokenizer=tok, checkpoints=["a.pt"]), "brings its own weights: drop option(s) "
                                                                      "checkpoints"),
             (dict(model=model, tokenizer=tok, precision="bf16"), "the model object is fp32"),
             (dict(model=model, tokenizer=tok, executor="ray"), "use the local executor"),
             (dict(model=model, tokenizer=tok, fingerprint=""), "option 'fingerprint'"),
             (dict(model=str(world["cfg"]), tokenizer=tok), "go with a model object"),
             (dict(model=model, tokenizer=tok, processor=object()), "processor= goes with a transformers model")]
    for kw, want in cases:
        with pytest.raises(UsageError) as e:
            _run(world, tmp_path, "out", **kw)
        msg = str(e.value)
        assert want in msg and len(msg.splitlines()) == 1 and len(msg) < 700, (kw, msg)
    assert not list((tmp_path / "out").rglob("*.json"))
    assert model.training  # (create_model_and_transforms leaves it in training mode: untouched by the refusals)
