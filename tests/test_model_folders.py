"""No model folder runs code, reads outside itself or scores garbage: crafted folders through every command.

Each model kind's stand-in is saved as users save it (``hf:``: ``CLIPModel.save_pretrained`` +
``CLIPProcessor.save_pretrained``; ``blip:``: the same with BLIP's classes; ``local-dir:`` and ``hf-hub:``: an
open_clip folder with its Hugging Face tokenizer, the latter laid out in a Hugging Face cache with its blob
links). Each case then changes one thing, as someone handing the user a folder could: settings that name the
folder's own Python files (``auto_map``, a tokenizer class transformers lacks, open_clip ``tokenizer_kwargs``
asking for ``trust_remote_code``), hub kernels, paths and links leading out of the folder, a pickle in a
``.bin``, a config implying a 38 GB network, and tokenizers that cannot be the model's. Every crafted folder
holds ``tokenization_evil.py``, ``modeling_evil.py``, ``configuration_evil.py`` and
``image_processing_evil.py``, each writing a sentinel file when imported.

Through ``eval``, ``eval --dry-run``, ``mine`` and ``run`` each must exit 3 with one line naming the folder and
the file or key, write no result and no store shard, import none of the folder's files, build no network (the
model classes' constructors are watched; a tensor the weights lack is found as they load into the small,
size-checked network) and open no connection (``socket`` refuses and counts). Every
(case, kind) pair runs through one command by default, the commands taking turns; ``-m matrix`` runs them all.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from blip_helpers import make_blip
from helpers import empty_hf_cache_no_network, make_karpathy_world
from hf_helpers import make_clip, make_open_clip, processor_file, publish
from tokenizers import Tokenizer, models, pre_tokenizers

from hardrank.errors import DataError
from hardrank.jobs.cli import main

KINDS = ("hf", "blip", "local-dir", "hf-hub")
COMMANDS = ("eval", "eval --dry-run", "mine", "run")
OPEN_CLIP = ("local-dir", "hf-hub")
REPO = "testorg/tiny-oc"  # the hf-hub kind's repo (the open_clip config's hf_tokenizer_name)
EVIL = {"tokenization_evil.py": "from transformers import PreTrainedTokenizerFast as Base\n"
                                "class EvilTokenizer(Base):\n    pass\n",
        "modeling_evil.py": "from transformers import CLIPModel as Base\nclass EvilModel(Base):\n    pass\n",
        "configuration_evil.py": "from transformers import CLIPConfig as Base\nclass EvilConfig(Base):\n"
                                 "    model_type = 'evil-clip'\n",
        "image_processing_evil.py": "from transformers import CLIPImageProcessor as Base\n"
                                    "class EvilImageProcessor(Base):\n    pass\n"}


class _Payload:
    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return os.system, (f"touch {self.sentinel}",)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """Each kind's stand-in (local-dir and hf-hub share the open_clip folder; hf-hub publishes it per test). The
    transformers folders are in transformers 4's layout, which hardrank read before this boundary existed, so a
    case's refusal is about the case; ``hf-5`` / ``blip-5``: transformers 5's (processor_config.json)."""
    root = tmp_path_factory.mktemp("bases")
    oc = make_open_clip(root / "open_clip")
    return {"hf": make_clip(root / "clip", layout="4"), "blip": make_blip(root / "blip", layout="4"),
            "hf-5": make_clip(root / "clip5"), "blip-5": make_blip(root / "blip5"), "local-dir": oc, "hf-hub": oc,
            "world": make_karpathy_world(root / "world", n_images=2)}


def _json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def _weights_name(kind: str) -> str:
    return "open_clip_model.safetensors" if kind in OPEN_CLIP else "model.safetensors"


def _model_config(folder: Path, kind: str) -> tuple[Path, callable]:
    """(the settings file, a function giving the dict that holds the text tower's sizes)."""
    if kind in OPEN_CLIP:
        return folder / "open_clip_config.json", lambda d: d["model_cfg"]["text_cfg"]
    return folder / "config.json", lambda d: d["text_config"]


def _save_tokenizer(folder: Path, tok: Tokenizer, **special) -> None:
    """Replace the folder's tokenizer with ``tok`` (saved as transformers saves one)."""
    from transformers import PreTrainedTokenizerFast

    for p in folder.glob("tokenizer*"):
        p.unlink()
    PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(folder)


def _word_level(words: list[str], unk: str = "[UNK]") -> Tokenizer:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


# -- the cases: each changes the folder and returns what the refusal must name ------------------------------
def _auto_map_config(folder, kind, tmp):
    _json(folder / "config.json", lambda d: d.update(auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                                               "AutoModel": "modeling_evil.EvilModel"}))
    return "config.json sets auto_map"


def _auto_map_unknown_type(folder, kind, tmp):
    """A model type transformers lacks: transformers itself would ask "run the custom code? [y/N]"."""
    _json(folder / "config.json", lambda d: d.update(model_type="evil-clip", auto_map={
        "AutoConfig": "configuration_evil.EvilConfig", "AutoModel": "modeling_evil.EvilModel"}))
    return "config.json sets auto_map"


def _auto_map_tokenizer(folder, kind, tmp):
    _json(folder / "tokenizer_config.json",
          lambda d: d.update(auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}))
    return "tokenizer_config.json sets auto_map"


def _auto_map_processor(folder, kind, tmp):
    def change(d):
        image = d.get("image_processor", d)
        image.update(image_processor_type="EvilImageProcessor",
                     auto_map={"AutoImageProcessor": "image_processing_evil.EvilImageProcessor"})
    _json(processor_file(folder), change)
    return f"{processor_file(folder).name} sets image_processor"  # _type, or (transformers 5) .image_processor_type


def _custom_tokenizer_class(folder, kind, tmp):
    _json(folder / "tokenizer_config.json", lambda d: d.update(tokenizer_class="EvilTokenizer"))
    return "tokenizer_config.json sets tokenizer_class"


def _tokenizer_kwargs_trust(folder, kind, tmp):
    """The issue's first case: open_clip passes text_cfg.tokenizer_kwargs to AutoTokenizer.from_pretrained."""
    _auto_map_tokenizer(folder, kind, tmp)
    _json(folder / "open_clip_config.json",
          lambda d: d["model_cfg"]["text_cfg"]["tokenizer_kwargs"].update(trust_remote_code=True))
    return "open_clip_config.json sets model_cfg.text_cfg.tokenizer_kwargs {'trust_remote_code': true}"


def _tokenizer_named_by_path(folder, kind, tmp):
    """open_clip reads hf_tokenizer_name as a folder when one exists there: the folder's tokenizer moved out of it."""
    elsewhere = folder.parent / "elsewhere"
    elsewhere.mkdir()
    for p in folder.glob("tokenizer*"):
        p.rename(elsewhere / p.name)
    _json(folder / "open_clip_config.json",
          lambda d: d["model_cfg"]["text_cfg"].update(hf_tokenizer_name=str(elsewhere)))
    return "open_clip_config.json sets model_cfg.text_cfg.hf_tokenizer_name"


def _hub_kernels(folder, kind, tmp):
    _json(folder / "config.json", lambda d: d.update(attn_implementation="kernels-community/evil-attention"))
    return "config.json sets attn_implementation"


def _sharded_elsewhere(folder: Path, kind, tmp, absolute: bool):
    from safetensors import safe_open

    elsewhere = folder.parent / "elsewhere"
    elsewhere.mkdir()
    (folder / "model.safetensors").rename(elsewhere / "x.safetensors")
    with safe_open(str(elsewhere / "x.safetensors"), "pt") as f:
        keys = list(f.keys())
    name = str(elsewhere / "x.safetensors") if absolute else "../elsewhere/x.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": (elsewhere / "x.safetensors").stat().st_size}, "weight_map": dict.fromkeys(keys,
                                                                                                         name)}))
    return "model.safetensors.index.json sets weight_map"


def _index_outside(folder, kind, tmp):
    return _sharded_elsewhere(folder, kind, tmp, absolute=False)


def _index_absolute(folder, kind, tmp):
    return _sharded_elsewhere(folder, kind, tmp, absolute=True)


def _vocab_file_passwd(folder, kind, tmp):
    _json(folder / "tokenizer_config.json", lambda d: d.update(vocab_file="/etc/passwd"))
    return "tokenizer_config.json sets vocab_file = '/etc/passwd'"


def _merges_file_outside(folder, kind, tmp):
    (folder.parent / "merges.txt").write_text("#version: 0.2\n")
    _json(folder / "tokenizer_config.json", lambda d: d.update(merges_file="../merges.txt"))
    return "tokenizer_config.json sets merges_file = '../merges.txt'"


def _weights_linked_outside(folder, kind, tmp):
    name = _weights_name(kind)
    (folder / name).rename(folder.parent / name)
    (folder / name).symlink_to(folder.parent / name)
    return f"{name} leads outside"


def _tokenizer_linked_outside(folder, kind, tmp):
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to("/etc/passwd")
    return "tokenizer.json leads outside"


def _pickle_bin(folder, kind, tmp):
    from safetensors.torch import load_file

    sd = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    torch.save({**sd, "evil": _Payload(tmp / "PWNED")}, folder / "pytorch_model.bin")
    return "posix.system"


def _missing_tensor(folder, kind, tmp):
    """Weights lacking one of the network's tensors (it would stay random: garbage scored)."""
    from safetensors.torch import load_file, save_file

    sd = load_file(str(folder / "model.safetensors"))
    sd.pop(next(k for k in sorted(sd) if k.endswith("proj.weight") or k.endswith("projection.weight")))
    save_file(sd, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return "missing_keys"


def _oversized(folder, kind, tmp):
    """A config asking for ~9.7 billion parameters (38 GB in fp32) beside the stand-in's small weights."""
    path, text = _model_config(folder, kind)
    if kind in OPEN_CLIP:
        _json(path, lambda d: text(d).update(width=4096, heads=32, layers=48))
    else:
        _json(path, lambda d: text(d).update(hidden_size=4096, intermediate_size=16384, num_hidden_layers=48,
                                             num_attention_heads=32))
    return f"{path.name} implies a network of"


def _no_tokenizer(folder, kind, tmp):
    for p in folder.glob("tokenizer*"):
        p.unlink()
    return "holds no tokenizer files"


def _empty_vocabulary(folder, kind, tmp):
    _save_tokenizer(folder, _word_level(["[PAD]", "[UNK]", "[CLS]", "[SEP]"]), pad_token="[PAD]", unk_token="[UNK]")
    return "has 4 tokens, too few"


def _foreign_tokenizer(folder, kind, tmp):
    """A bigger model's vocabulary: the probe captions' words have ids past the text tower's table."""
    words = ["[PAD]", "[UNK]", *(f"w{i}" for i in range(2000)), *"a photo of dog two red cars parked on street "
             "man riding horse the beach zebra 3 children 1 kite".split()]
    _save_tokenizer(folder, _word_level(list(dict.fromkeys(words))), pad_token="[PAD]", unk_token="[UNK]")
    return "past the text tower's vocab_size"


def _same_ids(folder, kind, tmp):
    """Another language's vocabulary, padded with its unknown token: every caption becomes the same ids."""
    _save_tokenizer(folder, _word_level(["[UNK]", *(f"mot{i}" for i in range(40))]), pad_token="[UNK]",
                    unk_token="[UNK]")
    return "gives every caption the same ids"


HF = ("hf", "blip")
CASES = {  # name: (change, kinds)
    "auto_map-config": (_auto_map_config, HF),
    "auto_map-unknown-model-type": (_auto_map_unknown_type, HF),
    "auto_map-tokenizer": (_auto_map_tokenizer, KINDS),
    "auto_map-processor": (_auto_map_processor, (*HF, "hf-5", "blip-5")),
    "custom-tokenizer_class": (_custom_tokenizer_class, KINDS),
    "tokenizer_kwargs-trust_remote_code": (_tokenizer_kwargs_trust, OPEN_CLIP),
    "tokenizer-named-by-path": (_tokenizer_named_by_path, OPEN_CLIP),
    "hub-kernels": (_hub_kernels, HF),
    "index-outside": (_index_outside, HF),
    "index-absolute": (_index_absolute, HF),
    "vocab_file-passwd": (_vocab_file_passwd, KINDS),
    "merges_file-outside": (_merges_file_outside, KINDS),
    "weights-linked-outside": (_weights_linked_outside, KINDS),
    "tokenizer-linked-outside": (_tokenizer_linked_outside, KINDS),
    "pickle-bin": (_pickle_bin, HF),
    "missing-tensor": (_missing_tensor, HF),
    "oversized-config": (_oversized, KINDS),
    "no-tokenizer": (_no_tokenizer, ("hf",)),  # (blip: refused before this boundary too)
    "empty-vocabulary": (_empty_vocabulary, KINDS),
    "foreign-tokenizer": (_foreign_tokenizer, KINDS),
    "same-ids": (_same_ids, KINDS),
}
BUILT_FIRST = ("missing-tensor",)  # found as the weights load into the (small, size-checked) network
PAIRS = [(case, kind) for case, (_, kinds) in CASES.items() for kind in kinds]
# each (case, kind) through one command by default, the commands taking turns; -m matrix: every command
PARAMS = [pytest.param(case, kind, command, marks=() if i % len(COMMANDS) == COMMANDS.index(command) else
                       pytest.mark.matrix, id=f"{case}-{kind}-{command.replace(' --', '-')}")
          for i, (case, kind) in enumerate(PAIRS) for command in COMMANDS]


def _spelling(kind: str, folder: Path) -> str:
    return {"hf": f"hf:{folder}", "blip": f"blip:{folder}", "hf-5": f"hf:{folder}", "blip-5": f"blip:{folder}",
            "local-dir": f"local-dir:{folder}", "hf-hub": f"hf-hub:{REPO}"}[kind]


def _command(command: str, model: str, world: dict, tmp: Path) -> list[str]:
    ann, images = world["annotations"] / "coco_karpathy_test.json", world["images"]
    data = ["--suite", "karpathy", "--annotations", str(ann), "--images", str(images)]
    common = ["--store", str(tmp / "store"), "--quiet"]
    if command == "run":
        job = tmp / "job.toml"
        job.write_text(f'out = "{tmp / "out"}"\nsuites = ["karpathy"]\n[options]\nannotations = "{ann}"\n'
                       f'images = "{images}"\nstore = "{tmp / "store"}"\n[[model]]\nmodel = "{model}"\n')
        return ["run", str(job), "--quiet"]
    if command == "mine":
        return ["mine", "--model", model, "--queries", str(ann), "--images", str(images), "--corpus",
                str(images / "val2014"), "-k", "1", "--out", str(tmp / "out"), *common]
    return ["eval", "--model", model, *data, "--out", str(tmp / "out"), *common,
            *(["--dry-run"] if command == "eval --dry-run" else [])]


@pytest.fixture()
def watched(tmp_path, monkeypatch):
    """No connection (counted), and every model class's constructor recorded and refused."""
    import open_clip.model
    import transformers

    net = empty_hf_cache_no_network(tmp_path / "hub", monkeypatch)
    built: list[str] = []
    watch = {"refuse": True}  # a case found only once the weights load (a missing tensor) lets the network build

    def watched_init(cls):
        original = cls.__init__

        def init(self, *args, **kwargs):  # refused as bad data, so the command goes on to say what else it did
            if not watch["refuse"]:
                return original(self, *args, **kwargs)
            built.append(type(self).__name__)
            raise DataError(f"{type(self).__name__} was built")
        monkeypatch.setattr(cls, "__init__", init)

    for cls in (transformers.PreTrainedModel, open_clip.model.CLIP, open_clip.model.CustomTextCLIP):
        watched_init(cls)
    return {**net, "built": built, "watch": watch}


def _crafted(bases, kind: str, case: str, tmp: Path, hub: Path) -> tuple[Path, str, Path]:
    """(the folder the user is handed, the refusal's expected words, the sentinel path)."""
    folder = tmp / "handed" / "model"
    shutil.copytree(bases[kind], folder, symlinks=True)
    sentinel = tmp / "RAN"
    for name, code in EVIL.items():
        (folder / name).write_text(f"import pathlib\npathlib.Path({str(sentinel)!r}).write_text('ran')\n{code}")
    expected = CASES[case][0](folder, kind, tmp)
    if kind == "hf-hub":
        folder = publish(folder, hub, REPO)
    return folder, expected, sentinel


@pytest.mark.parametrize(("case", "kind", "command"), PARAMS)
def test_a_crafted_folder_is_refused_before_anything_runs(case, kind, command, bases, watched, tmp_path, capsys):
    folder, expected, sentinel = _crafted(bases, kind, case, tmp_path, watched["hub"])
    watched["watch"]["refuse"] = case not in BUILT_FIRST
    rc = main(_command(command, _spelling(kind, folder), bases["world"], tmp_path))
    out = capsys.readouterr()
    text = out.out + out.err
    assert not sentinel.exists() and not (tmp_path / "PWNED").exists(), "a file of the folder ran"
    assert watched["tries"] == [], "a connection was tried"
    assert watched["built"] == [], f"a network was built before the refusal: {watched['built']}"
    assert rc == 3, text
    lines = [line for line in out.err.splitlines() if line.strip()]
    if command == "run":  # the job's header and summary lines around the entry's one line
        lines = [line for line in lines if ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in text, text
    assert str(folder) in lines[0] and expected in lines[0], lines[0]
    for advice in ("trust_remote_code=True", "pass the argument", "weights_only=False", "set to `False",
                   "ignore_mismatched_sizes"):
        assert advice not in text, text  # never relays a library's advice to turn a safeguard off
    written = [p for d in ("out", "store") for p in (tmp_path / d).rglob("*") if p.is_file()]
    assert written == [], written


@pytest.mark.parametrize("kind", (*KINDS, "hf-5", "blip-5", "hf-cached"))
def test_the_stand_ins_themselves_pass_every_check(kind, bases, tmp_path, capsys, monkeypatch):
    """The uncrafted folders (hf-hub: and hf:ORG/NAME through their cache's blob links; both transformers layouts)
    evaluate: exit 0, a result written."""
    net = empty_hf_cache_no_network(tmp_path / "hub", monkeypatch)
    if kind in ("hf-hub", "hf-cached"):
        folder = publish(bases["hf-hub" if kind == "hf-hub" else "hf-5"], net["hub"], REPO)
        assert os.path.islink(folder / "tokenizer.json") and os.path.islink(folder / "tokenizer_config.json")
        model = f"hf-hub:{REPO}" if kind == "hf-hub" else f"hf:{REPO}"
    else:
        folder, model = bases[kind], _spelling(kind, bases[kind])
    rc = main(_command("eval", model, bases["world"], tmp_path))
    assert rc == 0, capsys.readouterr().err
    assert list((tmp_path / "out").rglob("karpathy.json")) and net["tries"] == []


def test_every_from_pretrained_call_refuses_remote_code():
    """Every transformers ``from_pretrained`` call (and open_clip's HFTokenizer, which passes its keywords on to
    AutoTokenizer) in the package says ``trust_remote_code=False`` and ``local_files_only=True`` itself."""
    import ast

    import hardrank

    root = Path(hardrank.__file__).parent
    calls, bad = 0, []
    for folder in (root, root.parent / "jobs"):
        for path in folder.rglob("*.py"):
            tree = ast.parse(path.read_text())
            # open_clip's HFTokenizer, not hardrank's own (hf_models.HFTokenizer wraps a loaded tokenizer)
            names = {"from_pretrained"} | ({"HFTokenizer"} if any(
                isinstance(n, ast.ImportFrom) and n.module == "open_clip.tokenizer" for n in ast.walk(tree)) else set())
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in names:
                    calls += 1
                    kw = {k.arg: getattr(k.value, "value", None) for k in node.keywords}
                    if kw.get("trust_remote_code") is not False or kw.get("local_files_only") is not True:
                        bad.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert calls >= 6 and bad == [], bad


def test_every_model_option_names_every_model_form():
    """Each command that loads any model (eval, mine, perturb, attack, store export) names every --model spelling
    in its help, blip: included, from the one grammar in hardrank.models."""
    from hardrank.jobs.cli import build_parser

    helps, todo = {}, [("", build_parser())]
    while todo:
        name, parser = todo.pop(0)
        for action in parser._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                todo.extend((f"{name} {k}".strip(), v) for k, v in action.choices.items())
            elif action.dest == "model":
                helps[name] = " ".join((action.help or "").split())
    loaders = ("eval", "mine", "perturb texts", "attack texts", "attack images", "store export")
    assert set(loaders) <= set(helps), sorted(helps)
    for name in loaders:
        for spelling in ("NAME", "CONFIG.json", "hf-hub:ORG/NAME", "local-dir:FOLDER", "hf:FOLDER", "hf:ORG/NAME",
                         "blip:FOLDER", "blip:ORG/NAME", "BlipForImageTextRetrieval"):
            assert spelling in helps[name], (name, spelling, helps[name])


@pytest.mark.parametrize("kind", ["hf", "local-dir"])
def test_random_weights_past_this_machines_memory_are_refused_unbuilt(kind, bases, watched, tmp_path):
    """With --random-init and no weights to compare with, a config implying more memory than the machine has
    (here ~10^13 parameters) is refused before any network is built, naming the config and the sizes."""
    import hardrank
    from hardrank.errors import DataError

    folder = tmp_path / "model"
    shutil.copytree(bases[kind], folder)
    (folder / _weights_name(kind)).unlink()
    path, text = _model_config(folder, kind)
    if kind in OPEN_CLIP:
        _json(path, lambda d: text(d).update(width=65536, heads=64, layers=512))
    else:
        _json(path, lambda d: text(d).update(hidden_size=65536, intermediate_size=65536, num_hidden_layers=512,
                                             num_attention_heads=64))
    with pytest.raises(DataError, match=rf"{path.name} implies a network of [\d.]+ billion parameters, [\d.]+ GB in "
                                        r"fp32, more than this machine's [\d.]+ GB of memory"):
        hardrank.load_model(hardrank.ModelSpec(_spelling(kind, folder), random_init=True, device="cpu"))
    assert watched["built"] == [] and watched["tries"] == []


@pytest.mark.parametrize("family", ["clip", "siglip", "siglip2", "blip"])
def test_the_size_estimate_is_within_a_few_percent_of_the_network(family):
    """The parameters a config implies, from its sizes alone (nothing built), against the network transformers
    builds from it (on the meta device: no memory), at the published base models' default sizes."""
    import transformers

    from hardrank.models.boundary import estimate_params

    config_cls, model_cls = {"clip": ("CLIPConfig", "CLIPModel"), "siglip": ("SiglipConfig", "SiglipModel"),
                             "siglip2": ("Siglip2Config", "Siglip2Model"),
                             "blip": ("BlipConfig", "BlipForImageTextRetrieval")}[family]
    config = getattr(transformers, config_cls)()
    with torch.device("meta"):
        built = sum(p.numel() for p in getattr(transformers, model_cls)(config).parameters())
    assert 0.95 < estimate_params(config.to_dict()) / built < 1.05


def test_the_size_check_reads_headers_and_leaves_unknown_formats_to_their_loader(tmp_path):
    """safetensors: the header's shapes; a torch archive: its data records' bytes; a numpy .npz or a legacy pickle
    tells neither, so only the memory check applies."""
    import numpy as np
    from safetensors.torch import save_file

    from hardrank.errors import DataError
    from hardrank.models.boundary import check_size

    save_file({"w": torch.zeros(1000, 100)}, str(tmp_path / "w.safetensors"))
    torch.save({"w": torch.zeros(1000, 100)}, tmp_path / "w.pt")
    np.savez(tmp_path / "w.npz", w=np.zeros((1000, 100), np.float32))
    torch.save({"w": torch.zeros(1000, 100)}, tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
    for name in ("w.safetensors", "w.pt"):
        check_size(100_000, [tmp_path / name], what="m", config="c.json", precision="fp32")
        with pytest.raises(DataError, match=r"c.json implies a network of 10.00 million parameters \(40.0 MB in fp32\)"
                                            rf", but its weights \({tmp_path / name}\) hold 0.\d+ million"):
            check_size(10_000_000, [tmp_path / name], what="m", config="c.json", precision="fp32")
    for name in ("w.npz", "legacy.pt"):
        check_size(10_000_000, [tmp_path / name], what="m", config="c.json", precision="fp32")
