"""Start-up and exit of the `hardrank` command: open_clip without transformers until a model needs it,
texts tokenised ahead of their encode, and a quick exit that still runs what exiting must."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import hardrank
from hardrank.encoding.job import EmbedJob, EncodeStage
from hardrank.models.load import load_model
from tests.helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, *args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], capture_output=True,
                          text=True, cwd=cwd or ROOT, timeout=300)


def test_import_hardrank_leaves_transformers_until_a_text_tower_needs_it():
    """`import hardrank` imports open_clip but not transformers; binding it afterwards gives open_clip's
    transformers text tower the real classes: a tiny BERT tower builds and runs."""
    pytest.importorskip("transformers")
    p = _python("""
        import sys
        import hardrank
        from open_clip import hf_model
        before = "transformers" in sys.modules, hf_model.transformers is None
        from hardrank.openclip_import import bind_transformers
        bind_transformers()
        import torch, transformers
        cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=32, max_position_embeddings=16)
        tower = hf_model.HFTextEncoder(None, output_dim=8, config=cfg, pooler_type="mean_pooler", proj_type="linear",
                                      pretrained=False)
        out = tower(torch.tensor([[1, 5, 7, 2, 0, 0]]))
        print(before, hf_model.AutoConfig is transformers.AutoConfig, tuple(out.shape))
    """)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "(False, True) True (1, 8)", p.stdout


def test_a_process_that_imported_transformers_first_keeps_open_clip_as_usual():
    pytest.importorskip("transformers")
    p = _python("""
        import transformers
        import hardrank
        from open_clip import hf_model
        print(hf_model.transformers is transformers)
    """)
    assert p.returncode == 0 and p.stdout.strip() == "True", p.stderr[-2000:]


def test_texts_tokenised_ahead_encode_as_tokenised_in_place(tmp_path):
    """EncodeStage.prepare (the local executor's prefetch thread) gives the embeddings __call__ gives alone,
    rows marked not ok left out alike; two checkpoints share one tokenisation."""
    cfg = write_tiny_config(tmp_path)
    ckpts = [save_random_checkpoint(cfg, tmp_path / f"{s}.safetensors", s) for s in (0, 1)]
    models = [load_model(hardrank.ModelSpec(str(cfg), str(c), device="cpu")) for c in ckpts]
    texts = ("a dog", "two cats on a red bus", "", "a tree", "a man and a woman riding horses by a boat")
    job = EmbedJob("text", np.arange(len(texts)), texts, tuple(m.spec for m in models),
                   tuple(m.fingerprint for m in models), models[0].preprocess_cfg, batch_size=8)
    stage = EncodeStage(job, models=models)
    for ok in (None, np.array([True, False, True, True, False])):
        batch = {"modality": "text", "rows": job.rows, "items": list(texts), "models": (0, 1)}
        if ok is not None:
            batch["ok"] = ok
        ready = stage.prepare(batch)
        assert len(ready["tokens"]) == 1 and "tokens" not in batch  # one tokenizer for both checkpoints
        a, b = stage(ready), stage(batch)
        n = len(texts) if ok is None else int(ok.sum())
        for ea, eb in zip(a["emb"], b["emb"]):
            assert ea.shape == (n, 16) and np.array_equal(ea, eb)
    image_batch = {"modality": "image", "rows": job.rows[:1], "pixels": torch.zeros(1, 3, 32, 32)}
    assert stage.prepare(image_batch) is image_batch


def test_the_command_exits_quickly_yet_flushes_and_runs_exit_handlers(tmp_path):
    """`hardrank` (jobs.cli.entry) ends with os._exit after the command: its stdout arrives whole, the exit
    code is the command's, and atexit handlers (Ray's shutdown, temporary folders) still run."""
    w = make_karpathy_world(tmp_path / "w", n_images=3)
    cfg = write_tiny_config(tmp_path)
    ckpt = save_random_checkpoint(cfg, tmp_path / "c.safetensors", 0)
    flag = tmp_path / "atexit.txt"
    code = """
        import atexit, sys
        from pathlib import Path
        flag = Path(sys.argv[1])
        atexit.register(lambda: flag.write_text("ran"))
        from hardrank.jobs.cli import entry
        sys.argv = ["hardrank"] + sys.argv[2:]
        entry()
    """
    args = ["eval", "--suite", "karpathy", "--model", cfg, "--checkpoint", ckpt, "--annotations",
            w["annotations"], "--images", w["images"], "--out", tmp_path / "out", "--store", tmp_path / "s"]
    p = _python(code, flag, *args)
    assert p.returncode == 0, p.stderr[-2000:]
    assert flag.read_text() == "ran"
    lines = p.stdout.rstrip().splitlines()  # the whole table got out: its row, then the legend, the last line
    assert "i2t R@1" in p.stdout and lines[-1].startswith("±: half the width") and lines[-3].startswith("c ")
    assert json.loads((tmp_path / "out" / "c" / "karpathy.json").read_text())["counts"]
    flag.unlink()
    bad = _python(code, flag, *args[:-2], "--store", tmp_path / "s", "--tie-rule", "index", "--seeds", "x")
    assert bad.returncode == 2 and "--seeds" in bad.stderr
    missing = _python(code, flag, "eval", "--suite", "karpathy", "--model", cfg, "--checkpoint",
                      tmp_path / "nope.pt", "--annotations", w["annotations"], "--images", w["images"],
                      "--out", tmp_path / "o2")
    assert missing.returncode not in (0, 1) and "nope.pt" in missing.stderr and "Traceback" not in missing.stderr
    assert flag.read_text() == "ran"



# A subprocess's code that holds the thread named "first" as it starts executing the first module whose name
# starts with HOLD (its import of the package above it has begun), until `release` is set; `inside` says it
# is held. It holds in the loader, not the finder: Python 3.11 calls finders under its global import lock.
_HOLD = """
    import importlib.machinery, sys, threading
    inside, release = threading.Event(), threading.Event()

    class Hold:
        def find_spec(self, name, path=None, target=None):
            if not name.startswith(HOLD) or threading.current_thread().name != "first" or inside.is_set():
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            real = spec.loader

            class Held:
                def create_module(self, spec):
                    return real.create_module(spec)

                def exec_module(self, module):
                    inside.set()
                    release.wait()
                    real.exec_module(module)

            spec.loader = Held()
            return spec

    sys.meta_path.insert(0, Hold())
"""


def _held(before: str, hold: str, after: str) -> str:
    """Code: ``before``, then the holding finder for modules named ``hold...``, then ``after``."""
    return textwrap.dedent(before) + f"HOLD = {hold!r}\n" + textwrap.dedent(_HOLD) + textwrap.dedent(after)


def test_a_thread_that_imports_transformers_while_another_does_gets_the_whole_module():
    """Two threads' first use of transformers (a Ray actor decodes one batch while it loads the model for
    another): the second waits for the first thread's `import transformers`, whose package replaces itself
    in sys.modules (a lazy module) at its end. The `import` statement then hands the waiting thread the
    module object it found before waiting, an empty shell ("module 'transformers' has no attribute
    'CLIPImageProcessor'"); hardrank takes transformers from ``openclip_import.import_transformers``.
    The interleaving is forced: the first thread is held inside transformers' ``__init__`` until the second
    waits for it."""
    pytest.importorskip("transformers")
    p = _python(_held("""
        import sys, threading, time
        import hardrank
        from hardrank.models.hf_models import hf_image_processor
        assert "transformers" not in sys.modules
    """, "transformers.", """
        first = threading.Thread(target=lambda: __import__("transformers"), name="first")
        first.start()
        inside.wait()
        got = {}

        def second():
            try:
                cfg = {"hf_image_processor": {"image_processor_type": "CLIPImageProcessor"}}
                got["processor"] = type(hf_image_processor(cfg)).__name__
            except Exception as exc:
                got["error"] = f"{type(exc).__name__}: {exc}"

        t = threading.Thread(target=second)
        t.start()
        deadline = time.monotonic() + 120  # a hang guard, not a timing: the second thread blocks at once
        while t.is_alive() and time.monotonic() < deadline:  # until it waits on the module lock of transformers
            f = sys._current_frames().get(t.ident)
            if f is not None and f.f_code.co_name == "acquire" and "importlib._bootstrap" in f.f_code.co_filename:
                break
            time.sleep(0.01)
        waited = t.is_alive()
        release.set()
        first.join()
        t.join()
        print(waited, got)
    """))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "True {'processor': 'CLIPImageProcessor'}", p.stdout


def test_open_clip_imported_in_one_thread_hides_transformers_from_that_thread_alone():
    """The hiding lasts while open_clip is imported, in the thread that imports it: another thread's
    `import transformers` meanwhile gets transformers, not an ImportError (nor a MissingExtra telling the
    user to install what is installed). Forced: the first thread is held inside open_clip's import."""
    pytest.importorskip("transformers")
    p = _python(_held("""
        import torch
    """, "open_clip.", """
        def first():
            import hardrank  # noqa: F401
            import open_clip  # noqa: F401

        t = threading.Thread(target=first, name="first")
        t.start()
        inside.wait()
        try:
            import transformers
            got = type(transformers.AutoConfig).__name__
        except ImportError as exc:
            got = f"ImportError: {exc}"
        release.set()
        t.join()
        from open_clip import hf_model
        print(got, hf_model.transformers is sys.modules.get("transformers"))
    """))
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "type True", p.stdout


def test_help_and_version_import_no_torch():
    """`hardrank --help`, `--version`, no command or an unknown one: answered by the front page, which imports
    neither torch nor open_clip nor numpy (0.1 s where importing them took 4-8 s); `--version` is the
    installed package's."""
    from importlib.metadata import version

    p = _python("""
        import sys
        from hardrank.jobs.cli import main
        codes = []
        for argv in (["--help"], ["--version"], [], ["-v", "--help"], ["evl"], ["-h", "eval"]):
            try:
                main(argv)
            except SystemExit as exc:
                codes.append(exc.code)
        print(codes, sorted(m for m in ("torch", "open_clip", "numpy", "transformers") if m in sys.modules))
    """)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "[0, 0, 2, 0, 2, 0] []", p.stdout[-2000:]
    assert f"hardrank {version('hardrank')}\n" in p.stdout
    assert "eval                evaluate checkpoints on benchmark suites" in p.stdout  # the front page's list
    assert "invalid choice: 'evl'" in p.stderr
    script = Path(sys.executable).with_name("hardrank")  # the console script, as a user runs it
    if script.is_file():
        out = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and out.stdout == f"hardrank {version('hardrank')}\n", out


def test_the_front_page_is_the_full_parsers_page():
    """The front page (no command's module imported) lists what the full parser lists, in the same words."""
    from hardrank.jobs.cli import build_parser

    assert build_parser(()).format_help() == build_parser().format_help()
    assert "--version" in build_parser(()).format_help()


def test_import_hardrank_is_light_and_its_names_load_on_first_use():
    """`import hardrank` imports no torch; its names (``__all__``) load on first use, all of them;
    ``hardrank.evaluate`` stays the function once its module is imported (the import system names the
    module there)."""
    p = _python("""
        import sys
        import hardrank
        light = "torch" not in sys.modules and "open_clip" not in sys.modules
        import hardrank.evaluate
        is_function = callable(hardrank.evaluate) and hardrank.evaluate.__module__ == "hardrank.evaluate"
        missing = [n for n in hardrank.__all__ if getattr(hardrank, n, None) is None]
        print(light, is_function, missing, set(hardrank.__all__) <= set(dir(hardrank)))
    """)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "True True [] True", p.stdout


# the packages a program (or a Ray worker) may import first: each must import alone, whichever comes first
_FIRST_IMPORTS = ("hardrank.config", "hardrank.embed", "hardrank.evaluate", "hardrank.executors",
                  "hardrank.executors.ray_embed", "hardrank.inputs", "hardrank.kernels", "hardrank.mining",
                  "hardrank.models", "hardrank.perturb", "hardrank.scoring", "hardrank.store", "hardrank.suites",
                  "hardrank.toyworld", "hardrank.jobs.bench", "hardrank.jobs.report")


def test_any_package_imports_first_with_the_wait_policy_and_without_transformers():
    """With `import hardrank` light, a program may start at any module: each of these imports alone in a
    fresh process (no circle between them trips over a half-imported module), OpenMP's wait policy is set
    before torch loads, and open_clip comes without transformers."""
    pytest.importorskip("ray")
    from concurrent.futures import ThreadPoolExecutor

    code = ("import os, sys; os.environ.pop('OMP_WAIT_POLICY', None); import {m}; from hardrank import cpus; "
            "print(cpus.wait_policy(), 'transformers' in sys.modules)")
    with ThreadPoolExecutor(4) as pool:  # four processes at a time: each imports torch
        runs = dict(zip(_FIRST_IMPORTS, pool.map(lambda m: _python(code.format(m=m)), _FIRST_IMPORTS)))
    bad = {m: (p.stdout.strip(), p.stderr.strip().splitlines()[-1:]) for m, p in runs.items()
           if p.returncode != 0 or p.stdout.strip() != "PASSIVE False"}
    assert not bad, bad


_RAY_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(INFO|WARNING) \S+\.py:\d+ -- ", re.M)  # Ray's format


@pytest.mark.slow
def test_ray_keeps_its_own_lines_to_itself_unless_verbose(tmp_path):
    """`hardrank eval --executor ray`: Ray's own start-up lines (``Started a local Ray instance``, its
    warnings) and its workers' relayed output stay out of the command's output; `-v` shows them."""
    pytest.importorskip("ray")
    w = make_karpathy_world(tmp_path / "w", n_images=3)
    cfg = write_tiny_config(tmp_path)
    ckpt = save_random_checkpoint(cfg, tmp_path / "c.safetensors", 0)
    code = "import sys; from hardrank.jobs.cli import main; sys.exit(main(sys.argv[1:]))"
    outs = {}
    for flags in ((), ("-v",)):
        args = [*flags, "eval", "--suite", "karpathy", "--model", cfg, "--checkpoint", ckpt, "--annotations",
                w["annotations"], "--images", w["images"], "--out", tmp_path / f"out{len(flags)}", "--store",
                tmp_path / f"s{len(flags)}", "--executor", "ray", "--quiet"]
        p = _python(code, *args)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "i2t R@1" in p.stdout
        outs[flags] = p.stdout + p.stderr
    assert not _RAY_LINE.search(outs[()]) and "(raylet)" not in outs[()], outs[()][-3000:]
    assert _RAY_LINE.search(outs[("-v",)]), outs[("-v",)][-3000:]
