"""One model spec: every --model spelling parsed once into (kind, name) by the registry of model kinds, and a kind
added at run time is parsed, loaded and evaluated end to end with nothing but its one registry line."""
from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch
from helpers import TINY_CFG, make_karpathy_world
from open_clip.transform import PreprocessCfg

import hardrank
from hardrank.config import SuiteOptions
from hardrank.errors import DataError, UsageError
from hardrank.models import KINDS, Kind, LoadedModel, ModelSpec, register_kind, unregister_kind
from hardrank.models.runs import user_specs
from hardrank.models.spec import forms_help, label, rebased, safe_name
from hardrank.suites import load_suites


@pytest.fixture
def folders(tmp_path):
    """A bare open_clip folder (open_clip_config.json) and a bare transformers one (config.json)."""
    oc, hf = tmp_path / "oc", tmp_path / "hfm"
    oc.mkdir()
    hf.mkdir()
    (oc / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG}))
    (hf / "config.json").write_text("{}")
    return oc, hf


def test_every_spelling_is_parsed_once_into_its_kind_and_name(folders):
    oc, hf = folders
    cases = {"ViT-B-32": ("open_clip", "ViT-B-32", "ViT-B-32"),
             "cfg/tiny.json": ("open_clip_config", "cfg/tiny.json", "cfg/tiny.json"),
             "hf-hub:org/name": ("open_clip_hub", "org/name", "hf-hub:org/name"),
             f"local-dir:{oc}": ("open_clip_folder", str(oc), f"local-dir:{oc}"),
             str(oc): ("open_clip_folder", str(oc), f"local-dir:{oc}"),      # a bare folder: by what it holds
             f"hf:{hf}": ("hf", str(hf), f"hf:{hf}"), "hf:org/name": ("hf", "org/name", "hf:org/name"),
             str(hf): ("hf", str(hf), f"hf:{hf}"),
             "blip:org/name": ("blip", "org/name", "blip:org/name")}
    for spelling, want in cases.items():
        s = ModelSpec(spelling, checkpoint="a.pt")
        assert (s.kind, s.name, s.arch) == want, spelling
        assert s.spec_kind is KINDS[s.kind] and s.spec_kind.portable
        again = ModelSpec(s.arch)  # the canonical spelling parses to the same spec
        assert (again.kind, again.name, again.arch) == want
    # user_specs (every command's flags) gives the same parsed specs, one per checkpoint
    a, b = user_specs(str(hf), ["x", None])
    assert (a.kind, a.arch, a.checkpoint, b.checkpoint) == ("hf", f"hf:{hf}", "x", None)


def test_a_folder_no_kind_takes_and_an_object_no_kind_takes_are_refused_in_one_line(tmp_path):
    empty = tmp_path / "nothing"
    empty.mkdir()
    with pytest.raises(DataError, match=r"neither an open_clip model \(open_clip_config.json.* nor a transformers"):
        ModelSpec(str(empty))
    with pytest.raises(UsageError) as e:
        ModelSpec(torch.nn.Linear(2, 2))
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "torch.nn.modules.linear.Linear" in msg and "open_clip model" in msg


def test_job_files_take_paths_relative_to_themselves_as_each_kind_reads_them(tmp_path, folders):
    """A config .json and a local-dir: folder always (as before); hf:/blip: only when the job file's folder
    holds that folder (else it is a repo id); names never."""
    base = tmp_path / "jobs"
    (base / "mine").mkdir(parents=True)
    (base / "mine" / "config.json").write_text("{}")
    assert rebased("cfg/a.json", base) == str(base / "cfg/a.json")
    assert rebased("local-dir:m", base) == f"local-dir:{base / 'm'}"
    assert rebased("hf:mine", base) == f"hf:{base / 'mine'}" and rebased("blip:mine", base) == f"blip:{base / 'mine'}"
    assert rebased("hf:org/name", base) == "hf:org/name"           # no such folder there: a repo id
    assert rebased("ViT-B-32", base) == "ViT-B-32" and rebased("hf-hub:org/name", base) == "hf-hub:org/name"
    assert rebased("/abs/a.json", base) == "/abs/a.json"
    # a job entry's default results folder, as before: a local-dir: folder's name, a config's stem, else as given
    assert label("local-dir:/x/my_model") == "my_model" and label("cfg/b32.json") == "b32"
    assert label("ViT-B-32") == "ViT-B-32" and label("hf:org/name") == "hf:org/name"


def test_the_registry_refuses_overlapping_prefixes_and_a_second_catch_all():
    with pytest.raises(ValueError, match="overlaps"):
        register_kind(Kind("twice", lambda s: None, prefix="hf:x"))
    with pytest.raises(ValueError, match="every other spelling"):
        register_kind(Kind("names", lambda s: None))
    with pytest.raises(ValueError, match="taken"):
        register_kind(Kind("hf", lambda s: None, prefix="other:"))
    assert "twice" not in KINDS and "names" not in KINDS


# -- a model kind added at run time: its module is this test, its registry line the register_kind below ------------
class _TinyEncoder(torch.nn.Module):
    """Images: a fixed projection of the 8 x 8 pixels; texts: a sum of byte embeddings (0 pads)."""

    def __init__(self, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.image = torch.nn.Parameter(torch.randn(3 * 8 * 8, 8, generator=g), requires_grad=False)
        self.text = torch.nn.Embedding(256, 8, padding_idx=0)
        with torch.no_grad():
            self.text.weight.copy_(torch.randn(256, 8, generator=g))
            self.text.weight[0] = 0

    def encode_image(self, pixels):  # (B, 3, 8, 8) -> (B, 8)
        return pixels.flatten(1) @ self.image

    def encode_text(self, tokens):  # (B, L) -> (B, 8)
        return self.text(tokens).sum(1)


def _bytes(texts) -> torch.Tensor:
    texts = [texts] if isinstance(texts, str) else list(texts)
    out = torch.zeros(len(texts), 48, dtype=torch.long)
    for i, t in enumerate(texts):
        b = list(t.encode()[:48])
        out[i, :len(b)] = torch.tensor(b)
    return out


def _load_tiny(spec: ModelSpec) -> LoadedModel:
    seed = int(spec.name)
    return LoadedModel(spec=spec, arch_name="tiny", model=_TinyEncoder(seed), tokenizer=_bytes,
                       preprocess_cfg={k: list(v) if isinstance(v, tuple) else v
                                       for k, v in asdict(PreprocessCfg(size=8)).items()},
                       fingerprint=f"tiny-{seed}-fp32", embed_dim=8, device="cpu", precision="fp32",
                       checkpoint_hash=None, info={"weights": f"seed {seed}"})


def test_a_kind_registered_at_run_time_is_parsed_loaded_and_evaluated_then_unregistered(tmp_path):
    """Adding a model kind is its loader plus one register_kind line: nothing else of hardrank changes. The kind
    then parses, appears in every --model help, loads, fills its store folder and scores like any other."""
    w = make_karpathy_world(tmp_path / "w", n_images=6)
    run = dict(suites=["karpathy"], annotations=str(w["annotations"]), images=str(w["images"]),
               store=str(tmp_path / "store"), device="cpu", bootstrap=0)
    register_kind(Kind("tiny-test", _load_tiny, prefix="tiny:", forms=(("tiny:SEED", "a test-only model"),)))
    try:
        assert "tiny:SEED (a test-only model)" in forms_help()
        s = ModelSpec("tiny:3")
        assert (s.kind, s.name) == ("tiny-test", "3")
        rep = hardrank.evaluate(model="tiny:3", out=str(tmp_path / "out"), **run)
        (r,) = rep.results
        assert r["model"] == "tiny:3" and r["model_fingerprint"] == "tiny-3-fp32"
        assert r["provenance"]["architecture"] == "tiny" and r["checkpoint"] == "3"
        assert (tmp_path / "store" / "tiny-3-fp32" / "manifest.json").is_file()
        # its scores are its embeddings' ranks: R@1 i2t recomputed from the stored embeddings, query by query
        store = hardrank.open_store(tmp_path / "store" / "tiny-3-fp32")
        tables = hardrank.Tables.empty()
        (suite,) = load_suites(["karpathy"], tables, SuiteOptions(annotations=str(w["annotations"]),
                                                                  images=str(w["images"])))
        task = next(t for t in suite.ranking if t.name == "i2t")
        img = store.read("image", [tables.images.keys()[i] for i in task.query_items]).astype(np.float32)
        txt = store.read("text", [tables.texts.keys()[i] for i in task.gallery_items]).astype(np.float32)
        best = (img @ txt.T).argmax(1)  # the first of equal scores: the index tie rule
        hits = [best[q] in task.pos_idx[task.pos_ptr[q]:task.pos_ptr[q + 1]] for q in range(task.num_queries)]
        assert r["metrics"]["original"]["i2t"]["R@1"] == pytest.approx(100 * np.mean(hits))
    finally:
        unregister_kind("tiny-test")
    assert "tiny-test" not in KINDS and "tiny:SEED" not in forms_help()
    with pytest.raises(UsageError, match="unknown model 'tiny:3'"):
        hardrank.evaluate(model="tiny:3", out=str(tmp_path / "out2"), **run)


def test_a_name_becomes_one_file_name_part_never_a_path():
    """Results folders and fingerprints are named by ``safe_name``: a fingerprint or folder named ``..`` (an
    in-memory model's, a user's) labelled the results folder above --out."""
    assert [safe_name(s) for s in ("..", ".", "a/../b", "v1.2-x", "")] == ["__", "_", "a_.._b", "v1.2-x", ""]
