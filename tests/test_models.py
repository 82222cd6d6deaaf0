"""Real model sources, offline: tags, hf-hub snapshots, local-dir folders, OpenAI TorchScript, training runs.

Each layout is written as its tool writes it, with random weights of a tiny architecture, and what
hardrank embeds (a real photograph and a caption, through the store) must equal what open_clip's own
loading path + transform give for the same source.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import huggingface_hub.constants as hf_constants
import numpy as np
import open_clip
import pytest
import torch
from open_clip import pretrained as oc_pretrained
from PIL import Image
from safetensors.torch import save_file

import hardrank
from hardrank.config import EvalConfig, build
from hardrank.errors import DataError, UsageError
from hardrank.jobs.cli import main
from hardrank.models.openclip import tag_preprocess
from hardrank.models.runs import checkpoint_complete, model_specs, read_params

# OpenAI-shaped (heads of 64, so open_clip's OpenAI path can infer the architecture from the weights)
TINY = {"embed_dim": 32, "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "head_width": 64, "patch_size": 16},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 1, "layers": 1}}
PHOTO = Path(__import__("matplotlib").get_data_path()) / "sample_data" / "grace_hopper.jpg"
CAPTION = "a portrait of an officer in uniform"
SIGLIPISH = {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bilinear", "resize_mode": "squash"}


@pytest.fixture(scope="module")
def arch(tmp_path_factory):
    """Two registered tiny architectures: GELU and QuickGELU (as open_clip's ``-quickgelu`` names)."""
    root = tmp_path_factory.mktemp("arch")
    for name, extra in (("hr-tiny", {}), ("hr-tiny-quickgelu", {"quick_gelu": True})):
        (root / f"{name}.json").write_text(json.dumps({**TINY, **extra}))
        open_clip.add_model_config(root / f"{name}.json")
    torch.manual_seed(0)
    model = open_clip.create_model("hr-tiny", pretrained=None)
    return {"root": root, "sd": {k: v.contiguous() for k, v in model.state_dict().items()}}


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache that huggingface_hub reads offline."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return cache


def _snapshot(cache: Path, repo: str, files: dict[str, object]) -> Path:
    """Files laid out as huggingface_hub caches a download: refs/main -> snapshots/<commit>/."""
    base = cache / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        if isinstance(content, dict) and all(isinstance(v, torch.Tensor) for v in content.values()):
            save_file(content, str(snap / name))
        else:
            (snap / name).write_text(json.dumps(content))
    return snap


def _hardrank_embeddings(spec: hardrank.ModelSpec, store: Path):
    pipe = hardrank.EmbedPipeline([spec], hardrank.EmbedOptions(store=str(store), device="cpu"))
    tables = hardrank.Tables.empty()
    tables.images.add(hardrank.ImageRef(str(PHOTO)))
    tables.texts.add(CAPTION)
    pipe.run(tables)
    emb = pipe.embeddings(0, tables, np.float32)
    return emb["image"][0], emb["text"][0], pipe


def _open_clip_embeddings(model, preprocess, name: str) -> tuple[np.ndarray, np.ndarray]:
    model.eval()
    with torch.no_grad():
        img = model.encode_image(preprocess(Image.open(PHOTO).convert("RGB"))[None]).float()
        txt = model.encode_text(open_clip.get_tokenizer(name)([CAPTION])).float()
    n = torch.nn.functional.normalize
    return n(img, dim=-1)[0].numpy(), n(txt, dim=-1)[0].numpy()


def _same(a, b):
    assert a.shape == b.shape and float(np.abs(a - b).max()) < 2e-5, float(np.abs(a - b).max())


def _quick_gelu(model) -> bool:
    return any(type(m).__name__ == "QuickGELU" for m in model.modules())


pytestmark = pytest.mark.skipif(not PHOTO.is_file(), reason="matplotlib's sample photograph is not installed")


# -- tags ------------------------------------------------------------------------------------------
def test_real_tags_set_their_authors_preprocessing():
    pp, qg = tag_preprocess("ViT-B-16-SigLIP", "webli")
    assert pp == {"mean": (0.5, 0.5, 0.5), "std": (0.5, 0.5, 0.5), "interpolation": "bicubic", "resize_mode": "squash"}
    assert not qg
    assert tag_preprocess("ViT-B-32", "openai")[1] is True          # OpenAI's weights are QuickGELU
    assert tag_preprocess("ViT-B-32", "laion2b_s34b_b79k")[1] is False
    with pytest.raises(UsageError, match="unknown pretrained tag 'nope' for ViT-B-32; its tags: .*laion2b_s34b_b79k"):
        tag_preprocess("ViT-B-32", "nope")


@pytest.mark.parametrize("tag, oc_name", [("siglipish", "hr-tiny"), ("oai", "hr-tiny-quickgelu")])
def test_tag_from_the_hub_cache_equals_open_clip(arch, hub, tmp_path, monkeypatch, tag, oc_name):
    """--pretrained TAG: the tag's preprocessing and activation, its weights from the local cache;
    equal to open_clip's own create_model_and_transforms(name, pretrained=TAG) (for a QuickGELU tag:
    the -quickgelu name, as open_clip 3 only warns when the plain name meets a QuickGELU tag)."""
    cfgs = {"siglipish": oc_pretrained._pcfg(hf_hub="testorg/tiny-siglipish/", **SIGLIPISH),
            "oai": oc_pretrained._pcfg(hf_hub="testorg/tiny-oai/", quick_gelu=True)}
    monkeypatch.setitem(oc_pretrained._PRETRAINED, "hr-tiny", cfgs)
    monkeypatch.setitem(oc_pretrained._PRETRAINED, "hr-tiny-quickgelu", cfgs)
    _snapshot(hub, f"testorg/tiny-{tag}", {"open_clip_model.safetensors": arch["sd"]})
    ours_img, ours_txt, pipe = _hardrank_embeddings(hardrank.ModelSpec("hr-tiny", pretrained=tag, device="cpu"),
                                                    tmp_path / "store")
    model, _, preprocess = open_clip.create_model_and_transforms(oc_name, pretrained=tag)
    ref_img, ref_txt = _open_clip_embeddings(model, preprocess, oc_name)
    _same(ours_img, ref_img)
    _same(ours_txt, ref_txt)
    m = pipe.models[0]
    assert _quick_gelu(m.model) == _quick_gelu(model) == (tag == "oai")
    assert {k: m.preprocess_cfg[k] for k in ("mean", "std", "resize_mode", "interpolation")} == \
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in model.visual.preprocess_cfg.items()
         if k in ("mean", "std", "resize_mode", "interpolation")}
    assert m.info["pretrained"] == tag and m.label == f"hr-tiny-{tag}"


def test_tag_weights_missing_from_the_cache_name_the_file_and_the_fetch(arch, hub, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(oc_pretrained._PRETRAINED, "hr-tiny",
                        {"siglipish": oc_pretrained._pcfg(hf_hub="testorg/absent/", **SIGLIPISH)})
    with pytest.raises(DataError, match=r"testorg/absent/open_clip_model.safetensors is not in the local Hugging "
                                        r"Face cache .* `hf download testorg/absent open_clip_model.safetensors`"):
        hardrank.load_model(hardrank.ModelSpec("hr-tiny", pretrained="siglipish", device="cpu"))
    rc = main(["eval", "--model", "hr-tiny", "--pretrained", "siglipish", "--suite", "karpathy", "--annotations",
               str(tmp_path / "x.json"), "--out", str(tmp_path / "o")])  # the model fails before the data is read
    assert rc == 3 and "hf download testorg/absent" in capsys.readouterr().err


def test_a_checkpoint_with_a_tag_uses_the_tags_preprocessing(arch, hub, tmp_path, monkeypatch):
    monkeypatch.setitem(oc_pretrained._PRETRAINED, "hr-tiny",
                        {"siglipish": oc_pretrained._pcfg(hf_hub="testorg/absent/", **SIGLIPISH)})
    ckpt = tmp_path / "finetuned.safetensors"
    save_file(arch["sd"], str(ckpt))
    m = hardrank.load_model(hardrank.ModelSpec("hr-tiny", str(ckpt), device="cpu", pretrained="siglipish"))
    assert m.preprocess_cfg["mean"] == [0.5, 0.5, 0.5] and m.preprocess_cfg["resize_mode"] == "squash"
    plain = hardrank.load_model(hardrank.ModelSpec("hr-tiny", str(ckpt), device="cpu"))
    assert plain.fingerprint != m.fingerprint   # the preprocessing is part of the fingerprint


def test_default_preprocessing_warns_when_every_tag_disagrees(arch, tmp_path, monkeypatch):
    monkeypatch.setitem(oc_pretrained._PRETRAINED, "hr-tiny",
                        {"webli": oc_pretrained._pcfg(hf_hub="x/y/", **SIGLIPISH),
                         "webli2": oc_pretrained._pcfg(hf_hub="x/z/", **SIGLIPISH)})
    ckpt = tmp_path / "c.safetensors"
    save_file(arch["sd"], str(ckpt))
    m = hardrank.load_model(hardrank.ModelSpec("hr-tiny", str(ckpt), device="cpu"))
    assert len(m.info["warnings"]) == 1 and "pass --pretrained TAG" in m.info["warnings"][0]
    monkeypatch.setitem(oc_pretrained._PRETRAINED, "hr-tiny",
                        {"webli": oc_pretrained._pcfg(hf_hub="x/y/", **SIGLIPISH), "plain": oc_pretrained._pcfg()})
    assert hardrank.load_model(hardrank.ModelSpec("hr-tiny", str(ckpt), device="cpu")).info["warnings"] == []


# -- hub snapshots and folders ----------------------------------------------------------------------
def _open_clip_config(preprocess: dict) -> dict:
    return {"model_cfg": TINY, "preprocess_cfg": {**{k: list(v) if isinstance(v, tuple) else v
                                                    for k, v in preprocess.items()}}}


def test_hf_hub_snapshot_and_local_dir_equal_open_clip(arch, hub, tmp_path):
    snap = _snapshot(hub, "testorg/tiny-hub", {"open_clip_config.json": _open_clip_config(SIGLIPISH),
                                               "open_clip_model.safetensors": arch["sd"]})
    ref_model, _, preprocess = open_clip.create_model_and_transforms("hf-hub:testorg/tiny-hub")
    ref = _open_clip_embeddings(ref_model, preprocess, "hf-hub:testorg/tiny-hub")
    for i, spec in enumerate([hardrank.ModelSpec("hf-hub:testorg/tiny-hub", device="cpu"),
                              hardrank.ModelSpec(f"local-dir:{snap}", device="cpu")]):
        img, txt, pipe = _hardrank_embeddings(spec, tmp_path / f"store{i}")
        _same(img, ref[0])
        _same(txt, ref[1])
        assert pipe.models[0].preprocess_cfg["resize_mode"] == "squash"
    with pytest.raises(DataError, match=r"testorg/nothing is not in the local Hugging Face cache .* "
                                        r"`hf download testorg/nothing`"):
        hardrank.load_model(hardrank.ModelSpec("hf-hub:testorg/nothing", device="cpu"))


# -- OpenAI TorchScript ---------------------------------------------------------------------------------
class _Node(torch.nn.Module):
    pass


class _Archive(torch.nn.Module):
    """Parameters under OpenAI's key names, scripted: what OpenAI's original .pt files are."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def _torchscript(sd: dict, path: Path) -> Path:
    root = _Archive()
    for key, value in sd.items():
        *parents, leaf = key.split(".")
        m = root
        for p in parents:
            if not hasattr(m, p):
                m.add_module(p, _Node())
            m = getattr(m, p)
        m.register_parameter(leaf, torch.nn.Parameter(value.clone(), requires_grad=False))
    for k, v in (("input_resolution", 32), ("context_length", 77), ("vocab_size", 49408)):
        root.register_buffer(k, torch.tensor(v))
    with pytest.warns(FutureWarning):
        torch.jit.script(root).save(str(path))
    return path


def test_openai_torchscript_archive_loads_with_quick_gelu(arch, tmp_path):
    torch.manual_seed(1)
    sd = open_clip.create_model("hr-tiny-quickgelu", pretrained=None).state_dict()
    # OpenAI's weights are fp16 values (open_clip's OpenAI path passes them through fp16)
    sd = {k: v.half().float() if v.is_floating_point() else v for k, v in sd.items()}
    path = _torchscript(sd, tmp_path / "ViT-tiny.pt")
    img, txt, pipe = _hardrank_embeddings(hardrank.ModelSpec("hr-tiny", str(path), device="cpu"), tmp_path / "s")
    ref_model = open_clip.load_openai_model(str(path), device="cpu")
    ref = _open_clip_embeddings(ref_model, open_clip.image_transform(32, is_train=False), "hr-tiny")
    _same(img, ref[0])
    _same(txt, ref[1])
    m = pipe.models[0]
    assert m.info["weights_format"] == "torchscript" and _quick_gelu(m.model) and _quick_gelu(ref_model)


# -- checkpoint files that cannot be loaded ----------------------------------------------------------
class _Opaque:
    pass


def test_each_bad_checkpoint_says_what_it_is(arch, tmp_path):
    cases = {}
    cases["garbage.safetensors"] = (b"\x00\xff" * 50, "not a readable .safetensors file")
    good = tmp_path / "good.safetensors"
    save_file(arch["sd"], str(good))
    cases["truncated.safetensors"] = (good.read_bytes()[:5000], "not a readable .safetensors file")
    pt = tmp_path / "good.pt"
    torch.save(arch["sd"], pt)
    cases["truncated.pt"] = (pt.read_bytes()[:4000], "truncated or corrupt PyTorch archive")
    cases["random.pt"] = (bytes(np.random.default_rng(0).integers(0, 256, 3000, dtype=np.uint8)),
                          "not a PyTorch checkpoint")
    cases["pickled.pt"] = (None, r"is a pickle holding Python objects \(test_models._Opaque\), not only tensors; "
                                 r"hardrank loads checkpoints with safe \(weights_only\) loading, which refuses them")
    wrong = dict(arch["sd"])
    wrong["text_projection"] = torch.zeros(3, 3)
    cases["wrong.safetensors"] = (None, "does not fit model 'hr-tiny'")
    other = dict(arch["sd"])  # another architecture's text width: open_clip asserts while resizing
    other["positional_embedding"] = torch.zeros(77, 48)
    cases["other.safetensors"] = (None, "does not fit model 'hr-tiny'")
    for name, (data, message) in cases.items():
        path = tmp_path / name
        if name == "pickled.pt":
            torch.save({"state_dict": arch["sd"], "args": _Opaque()}, path)
        elif name in ("wrong.safetensors", "other.safetensors"):
            save_file(wrong if name.startswith("wrong") else other, str(path))
        else:
            path.write_bytes(data)
        with pytest.raises(DataError, match=message) as err:
            hardrank.load_model(hardrank.ModelSpec("hr-tiny", str(path), device="cpu"))
        assert "weights_only=False" not in str(err.value) and "set to `False" not in str(err.value)  # safety stays on


def test_checkpoints_of_one_architecture_share_one_tokenizer(arch, tmp_path):
    """K checkpoints tokenise once (the embed stage keys tokenizers): building one per checkpoint read the
    BPE vocabulary K times. Another context length or a re-registered text config gets its own."""
    a = hardrank.load_model(hardrank.ModelSpec("hr-tiny", device="cpu", random_init=True))
    b = hardrank.load_model(hardrank.ModelSpec("hr-tiny", device="cpu", random_init=True))
    c = hardrank.load_model(hardrank.ModelSpec("hr-tiny", device="cpu", random_init=True, context_length=16))
    assert a.tokenizer is b.tokenizer and c.tokenizer is not a.tokenizer
    assert c.tokenizer.context_length == 16 and a.tokenizer.context_length == 77
    (tmp_path / "hr-tiny.json").write_text(json.dumps({**TINY, "text_cfg": {**TINY["text_cfg"], "context_length": 40}}))
    open_clip.add_model_config(tmp_path / "hr-tiny.json")
    try:
        d = hardrank.load_model(hardrank.ModelSpec("hr-tiny", device="cpu", random_init=True))
        assert d.tokenizer is not a.tokenizer and d.tokenizer.context_length == 40
    finally:
        open_clip.add_model_config(arch["root"] / "hr-tiny.json")


def test_a_model_without_weights_is_refused(arch, tmp_path, capsys):
    with pytest.raises(UsageError, match="--checkpoint FILE, --pretrained TAG .* or --random-init"):
        hardrank.load_model(hardrank.ModelSpec("hr-tiny", device="cpu"))
    m = hardrank.load_model(hardrank.ModelSpec("hr-tiny", device="cpu", random_init=True))
    assert m.info["random_init"] and m.label == "hr-tiny-init"
    assert main(["eval", "--model", "hr-tiny", "--suite", "karpathy", "--annotations", str(tmp_path / "a.json"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "--random-init" in capsys.readouterr().err


# -- training runs ---------------------------------------------------------------------------------------
PARAMS = {"batch_size": 256, "epochs": 3, "force_image_size": None, "force_quick_gelu": True,
          "image_interpolation": "bilinear", "image_mean": [0.5, 0.5, 0.5], "image_resize_mode": "squash",
          "image_std": [0.5, 0.5, 0.5], "lr": 0.0005, "model": "hr-tiny", "name": "exp", "precision": "amp",
          "pretrained": "", "siglip": False, "force_context_length": None}


def _run(folder: Path, epochs=(1, 2)) -> Path:
    """An open_clip training run folder: params.txt as the trainer writes it, epoch checkpoints."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "params.txt").write_text("".join(f"{k}: {PARAMS[k]}\n" for k in sorted(PARAMS)))
    for e in epochs:
        _epoch(folder, e)
    return folder


def _epoch(folder: Path, e: int, path: Path | None = None) -> Path:
    torch.manual_seed(10 + e)
    sd = open_clip.create_model("hr-tiny-quickgelu", pretrained=None).state_dict()
    path = path or folder / "checkpoints" / f"epoch_{e}.pt"
    torch.save({"epoch": e, "name": "exp", "state_dict": {"module." + k: v for k, v in sd.items()},
                "optimizer": {"state": {}, "param_groups": [{"lr": 1e-4}]}}, path)
    return path


def test_run_folder_rebuilds_the_trainers_model(arch, tmp_path):
    run = _run(tmp_path / "exp")
    params = read_params(run)
    assert params["force_quick_gelu"] is True and params["image_mean"] == [0.5, 0.5, 0.5] and params["pretrained"] == ""
    specs = model_specs(build(EvalConfig, {"run": str(run), "suites": ["toy"], "device": "cpu"}))
    assert [Path(s.checkpoint).name for s in specs] == ["epoch_1.pt", "epoch_2.pt"]
    img, txt, pipe = _hardrank_embeddings(specs[1], tmp_path / "s")
    model, _, preprocess = open_clip.create_model_and_transforms(
        "hr-tiny", force_quick_gelu=True, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5),
        image_interpolation="bilinear", image_resize_mode="squash")
    open_clip.load_checkpoint(model, str(run / "checkpoints" / "epoch_2.pt"))
    ref = _open_clip_embeddings(model, preprocess, "hr-tiny")
    _same(img, ref[0])
    _same(txt, ref[1])
    assert pipe.models[0].label == "epoch_2"


def test_eval_run_evaluates_every_epoch(arch, tmp_path):
    from helpers import make_karpathy_world

    w = make_karpathy_world(tmp_path / "w", n_images=4)
    run = _run(tmp_path / "exp")
    (run / "checkpoints" / "epoch_latest.pt").write_bytes((run / "checkpoints" / "epoch_2.pt").read_bytes())
    out = tmp_path / "res"
    rc = main(["eval", "--run", str(run), "--suite", "karpathy", "--annotations", str(w["annotations"]),
               "--images", str(w["images"]), "--out", str(out), "--store", str(tmp_path / "s"), "--quiet"])
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == ["epoch_1", "epoch_2"]   # epoch_latest is a copy: skipped
    res = json.loads((out / "epoch_2" / "karpathy.json").read_text())
    src = res["provenance"]["model_source"]
    assert src["preprocess"]["mean"] == [0.5, 0.5, 0.5] and src["preprocess"]["resize_mode"] == "squash"
    assert src["quick_gelu"] is True


def test_incomplete_checkpoints_are_recognised(arch, tmp_path):
    run = _run(tmp_path / "exp", epochs=(1,))
    whole = run / "checkpoints" / "epoch_1.pt"
    part = run / "checkpoints" / "epoch_2.pt"
    part.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert checkpoint_complete(whole) and not checkpoint_complete(part)
    st = tmp_path / "x.safetensors"
    save_file(arch["sd"], str(st))
    cut = tmp_path / "y.safetensors"
    cut.write_bytes(st.read_bytes()[:-10])
    assert checkpoint_complete(st) and not checkpoint_complete(cut)
    specs = model_specs(build(EvalConfig, {"run": str(run), "suites": ["toy"]}))
    assert [Path(s.checkpoint).name for s in specs] == ["epoch_1.pt"]


def test_watch_picks_up_a_checkpoint_written_while_it_runs(arch, tmp_path):
    """A checkpoint appears in pieces while `hardrank watch` polls: it is evaluated once whole."""
    from helpers import make_karpathy_world

    w = make_karpathy_world(tmp_path / "w", n_images=4)
    run = _run(tmp_path / "exp", epochs=(1,))
    staged = _epoch(run, 2, tmp_path / "staged.pt").read_bytes()
    target = run / "checkpoints" / "epoch_2.pt"

    def trainer():  # writes epoch_2 slowly, as torch.save into the final name does
        time.sleep(1.0)
        with open(target, "wb") as f:
            half = len(staged) // 2
            f.write(staged[:half])
            f.flush()
            time.sleep(1.5)
            f.write(staged[half:])

    t = threading.Thread(target=trainer)
    t.start()
    out = tmp_path / "res"
    rc = main(["watch", str(run), "--suite", "karpathy", "--annotations", str(w["annotations"]), "--images",
               str(w["images"]), "--out", str(out), "--store", str(tmp_path / "s"), "--interval", "0.3",
               "--settle", "0.5", "--until", "2", "--no-report", "--quiet"])
    t.join()
    assert rc == 0
    assert (out / "epoch_1" / "karpathy.json").is_file() and (out / "epoch_2" / "karpathy.json").is_file()
    res = json.loads((out / "epoch_2" / "karpathy.json").read_text())
    assert res["provenance"]["checkpoint_hash"] == hardrank.load_model(
        hardrank.ModelSpec("hr-tiny", str(target), device="cpu", quick_gelu=True)).checkpoint_hash


def test_low_precision_text_tower_runs_sequence_first_with_the_same_embeddings(arch, tmp_path):
    """bf16 loads run the text tower's blocks sequence-first (one flat GEMM per projection instead of a
    bmm over a per-position copy of the weight); the embeddings are those of the batch-first tower."""
    from hardrank.embed import TextEncoder
    from hardrank.models.openclip import _text_sequence_first

    ckpt = tmp_path / "c.safetensors"
    save_file(arch["sd"], str(ckpt))
    m16 = hardrank.load_model(hardrank.ModelSpec("hr-tiny", str(ckpt), precision="bf16", device="cpu"))
    m32 = hardrank.load_model(hardrank.ModelSpec("hr-tiny", str(ckpt), precision="fp32", device="cpu"))
    assert m16.model.transformer.batch_first is False
    assert all(b.attn.batch_first is False for b in m16.model.transformer.resblocks)
    assert m32.model.transformer.batch_first is True  # fp32 is left as open_clip builds it
    texts = ["a dog on a red sofa", "two men", "", "a very long caption " * 4, "a dog on a red sofa"]
    seq = TextEncoder([m16])({"text": texts})["emb0"]
    ref = open_clip.create_model("hr-tiny", pretrained=None).eval()
    ref.load_state_dict(arch["sd"])
    ref = ref.to(torch.bfloat16).requires_grad_(False)  # batch-first, as loaded before
    m16.model = ref
    batch_first = TextEncoder([m16])({"text": texts})["emb0"]
    assert np.allclose(seq, batch_first, atol=2e-2)  # bf16 rounding; bit-identical where both GEMMs agree
    assert (seq * batch_first).sum(1).min() > 0.999
    assert _text_sequence_first(torch.nn.Linear(2, 2)) is False  # not an open_clip text tower: untouched


def test_watch_and_the_api_log_each_epoch_to_tensorboard(arch, tmp_path):
    """`watch --log-to tensorboard:DIR` logs every epoch's headline metrics at its epoch, one writer for the
    whole watch; the Python API's evaluate(log_to=...) does the same for its checkpoints."""
    pytest.importorskip("torch.utils.tensorboard")
    from helpers import make_karpathy_world
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    w = make_karpathy_world(tmp_path / "w", n_images=4)
    run = _run(tmp_path / "exp")
    out = tmp_path / "res"
    rc = main(["watch", str(run), "--suite", "karpathy", "--annotations", str(w["annotations"]), "--images",
               str(w["images"]), "--out", str(out), "--store", str(tmp_path / "s"), "--once", "--settle", "0",
               "--no-report", "--log-to", f"tensorboard:{tmp_path / 'tb'}", "--quiet"])
    assert rc == 0
    ea = EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    want = {e: json.loads((out / f"epoch_{e}" / "karpathy.json").read_text())["metrics"]["original"]["i2t"]["R@1"]
            for e in (1, 2)}
    assert {s.step: s.value for s in ea.Scalars("karpathy/i2t R@1")} == pytest.approx(want)
    hardrank.evaluate(run=str(run), suites=["karpathy"], annotations=str(w["annotations"]), images=str(w["images"]),
                      out=str(tmp_path / "api"), store=str(tmp_path / "s"), log_to=[f"tensorboard:{tmp_path / 'tb2'}"])
    ea = EventAccumulator(str(tmp_path / "tb2"))
    ea.Reload()
    assert sorted(s.step for s in ea.Scalars("karpathy/t2i R@1")) == [1, 2]
