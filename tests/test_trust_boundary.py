"""No file a user gives ever runs code: crafted checkpoints through every loader entry point.

Each archive holds a pickle whose ``__reduce__`` calls ``os.system("touch SENTINEL")``: if any
unpickler ran it, the sentinel file appears. The archives wear the marks a loader might trust (a
``code/`` member as TorchScript archives have, a ``constants.pkl``), and each entry point (``eval``,
``eval --dry-run``, ``mine``, ``watch``, ``run``, ``hardrank.load_model``) must refuse them with a
message that says what the file is and never advises turning safe loading off.
"""
from __future__ import annotations

import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import torch
from helpers import make_karpathy_world, write_tiny_config

import hardrank
from hardrank.errors import DataError
from hardrank.jobs.cli import main


class _Payload:
    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return os.system, (f"touch {self.sentinel}",)


def _crafted(path: Path, sentinel: Path, mark: str) -> Path:
    """A torch.save zip whose pickle runs the payload, plus the member ``mark`` (``code/readme.txt``:
    what an OpenAI TorchScript archive carries; ``constants.pkl``: torch's own TorchScript test, also
    holding the payload; ``none``)."""
    torch.save({"state_dict": {"logit_scale": torch.zeros(())}, "args": _Payload(sentinel)}, path)
    if mark != "none":
        with zipfile.ZipFile(path, "a") as z:
            prefix = z.namelist()[0].split("/")[0]
            data = pickle.dumps(_Payload(sentinel), protocol=2) if mark == "constants.pkl" else b"hello"
            z.writestr(f"{prefix}/{mark}", data)
            if mark == "constants.pkl":
                z.writestr(f"{prefix}/code/__torch__/m.py", "class M(Module):\n  pass\n")
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("trust")
    cfg = write_tiny_config(root)
    w = make_karpathy_world(root / "w", n_images=4)
    return {"root": root, "cfg": cfg, **w}


MARKS = ["code/readme.txt", "constants.pkl", "none"]


def _assert_refused(sentinel: Path, text: str) -> None:
    assert not sentinel.exists(), "a pickle in the checkpoint ran"
    assert "weights_only=False" not in text and "weights_only` set to `False" not in text, text


@pytest.mark.parametrize("mark", MARKS)
def test_load_model_refuses_a_crafted_archive_without_running_it(world, tmp_path, mark):
    sentinel = tmp_path / "PWNED"
    ckpt = _crafted(tmp_path / "evil.pt", sentinel, mark)
    with pytest.raises(DataError) as err:
        hardrank.load_model(hardrank.ModelSpec(str(world["cfg"]), str(ckpt), device="cpu"))
    _assert_refused(sentinel, str(err.value))
    assert str(ckpt) in str(err.value)
    if mark != "constants.pkl":  # a pickle of objects: the message names the refused global
        assert "posix.system" in str(err.value) and "arbitrary code" in str(err.value)


def _entry_points(world, ckpt: Path, tmp: Path) -> dict[str, list[str]]:
    data = ["--annotations", str(world["annotations"] / "coco_karpathy_test.json"), "--images", str(world["images"])]
    model = ["--model", str(world["cfg"]), "--checkpoint", str(ckpt)]
    run = tmp / "exp"
    (run / "checkpoints").mkdir(parents=True)
    (run / "params.txt").write_text(f"model: {world['cfg'].stem}\npretrained: \nforce_quick_gelu: False\n")
    (run / "checkpoints" / "epoch_1.pt").write_bytes(ckpt.read_bytes())
    job = tmp / "job.toml"
    job.write_text(f'out = "{tmp / "grid"}"\nsuites = ["karpathy"]\n[options]\n'
                   f'annotations = "{world["annotations"] / "coco_karpathy_test.json"}"\n'
                   f'images = "{world["images"]}"\nstore = "{tmp / "store"}"\n'
                   f'[[model]]\nmodel = "{world["cfg"]}"\ncheckpoints = ["{ckpt}"]\n')
    common = ["--store", str(tmp / "store"), "--quiet"]
    return {
        "eval": ["eval", *model, "--suite", "karpathy", *data, "--out", str(tmp / "o"), *common],
        "eval --dry-run": ["eval", *model, "--suite", "karpathy", *data, "--out", str(tmp / "o"), "--dry-run",
                           "--store", str(tmp / "store")],
        "mine": ["mine", *model, "--queries", str(world["annotations"] / "coco_karpathy_test.json"), "--images",
                 str(world["images"]), "--corpus", str(world["images"] / "val2014"), "-k", "2",
                 "--out", str(tmp / "m"), *common],
        "watch": ["watch", str(run), "--model", str(world["cfg"]), "--suite", "karpathy", *data, "--out",
                  str(tmp / "w"), "--interval", "0.1", "--settle", "0", "--until", "1", "--no-report", *common],
        "run": ["run", str(job), "--quiet"],
    }


@pytest.mark.parametrize("entry", ["eval", "eval --dry-run", "mine", "watch", "run"])
def test_every_command_refuses_a_crafted_archive_without_running_it(world, tmp_path, capsys, entry):
    sentinel = tmp_path / "PWNED"
    ckpt = _crafted(tmp_path / "evil.pt", sentinel, "code/readme.txt")
    rc = main(_entry_points(world, ckpt, tmp_path)[entry])
    out = capsys.readouterr()
    _assert_refused(sentinel, out.out + out.err)
    assert rc == 3, out.out + out.err
    assert "posix.system" in out.out + out.err


def test_a_real_torchscript_archive_still_loads_and_no_torch_load_of_it_unpickles(world, tmp_path):
    """The TorchScript path reads parameters with torch.jit.load: a scripted module's weights arrive."""
    import open_clip

    name = hardrank.models.openclip.resolve_arch(str(world["cfg"]))
    torch.manual_seed(3)
    ref = open_clip.create_model(name, pretrained=None)

    class Holder(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x

    root = Holder()
    for key, value in ref.state_dict().items():
        *parents, leaf = key.split(".")
        m = root
        for p in parents:
            if not hasattr(m, p):
                m.add_module(p, torch.nn.Module())
            m = getattr(m, p)
        m.register_buffer(leaf, value.clone())
    path = tmp_path / "openai.pt"
    with pytest.warns(FutureWarning):
        torch.jit.script(root).save(str(path))
    assert "constants.pkl" in {n.split("/", 1)[-1] for n in zipfile.ZipFile(path).namelist()}
    m = hardrank.load_model(hardrank.ModelSpec(str(world["cfg"]), str(path), device="cpu", quick_gelu=False))
    assert m.info["weights_format"] == "torchscript"
    for k, v in ref.state_dict().items():
        assert torch.equal(m.model.state_dict()[k], v), k


def test_no_code_path_passes_weights_only_false():
    """Nothing in the package may ever ask for a full unpickle (a keyword, not a mention in prose)."""
    import ast

    root = Path(hardrank.__file__).parent
    hits = []
    for folder in (root, root.parent / "kernels", root.parent / "jobs", root.parent / "benchmarks"):
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.keyword) and isinstance(node.value, ast.Constant) and (
                        (node.arg == "weights_only" and node.value.value is not True)
                        or (node.arg == "allow_pickle" and node.value.value is True)):
                    hits.append(f"{path}:{node.value.lineno}")
    assert hits == [], hits


def test_json_with_a_checkpoint_mark_is_not_read_as_code(tmp_path):
    """The sniffing itself opens files as bytes/zip only (a JSON file posing as a checkpoint)."""
    fake = tmp_path / "x.pt"
    fake.write_text(json.dumps({"state_dict": {}}))
    with pytest.raises(DataError, match="not a PyTorch checkpoint"):
        hardrank.load_model(hardrank.ModelSpec(str(write_tiny_config(tmp_path)), str(fake), device="cpu"))
