"""CLI conventions: help with examples everywhere, TOML job files, dry-run plans, exit codes."""
import argparse
import textwrap

import pytest
from helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config

from hardrank import executors
from hardrank.executors import RayExecutor
from hardrank.jobs.cli import build_parser, main
from hardrank.jobs.grid import JobFileError, load_job


def _all_parsers(p: argparse.ArgumentParser, path=("hardrank",)):
    yield path, p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _all_parsers(sp, (*path, name))


def test_every_command_has_help_with_examples():
    seen = {}
    for path, p in _all_parsers(build_parser()):
        cmd = " ".join(path)
        seen[cmd] = text = p.format_help()
        parent = seen.get(" ".join(path[:-1]), "")
        # examples in its own help, or in its parent's help naming it (`perturb` shows `perturb texts`)
        assert "examples:" in text or f"{cmd} " in parent, f"`{cmd} --help` shows no examples"
    for cmd in ("hardrank run", "hardrank report", "hardrank bench", "hardrank bench pipeline"):
        assert cmd in seen
    assert "exit codes: 0 ok, 2 usage" in build_parser().format_help()


def test_help_and_usage_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["report", "--help"])
    assert e.value.code == 0 and "RESULTS_DIR" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["no-such-command"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["eval", "--suite", "toy"])  # --out missing
    assert e.value.code == 2
    assert main(["eval", "--suite", "toy", "--out", "x"]) == 2  # neither --model nor --embeddings
    assert "give --model" in capsys.readouterr().err


# -- job files -------------------------------------------------------------------------------
def _job(tmp_path, body: str):
    p = tmp_path / "job.toml"
    p.write_text(textwrap.dedent(body))
    return p


def test_job_file_parses_resolves_and_expands(tmp_path):
    (tmp_path / "ck").mkdir()
    for n in ("epoch_2.pt", "epoch_1.pt"):
        (tmp_path / "ck" / n).write_bytes(b"")
    job = load_job(_job(tmp_path, """
        out = "res"
        suites = ["rococo", "karpathy"]
        [options]
        annotations = "data/rococo"
        image_variants = "mix_0.9"
        seeds = [1, 10]
        batch_size = 64
        [[model]]
        model = "ViT-B-32"
        checkpoints = ["ck/epoch_*.pt"]
        [[model]]
        model = "cfg/tiny.json"
        suites = ["toy"]
        [[model]]
        name = "mine"
        embeddings = "e.parquet"
    """))
    assert job.out == str(tmp_path / "res")
    a, b, c = job.models
    for m in job.models:  # [options] reach every entry's config, paths relative to the job file
        assert m.config.suite_options.annotations == str(tmp_path / "data" / "rococo")
        assert m.config.suite_options.image_variants == ("mix_0.9",) and m.config.suite_options.seeds == (1, 10)
        assert m.config.embed.batch_size == 64 and m.config.embed.precision == "auto"  # defaults kept
        assert m.config.out == str(tmp_path / "res" / m.name)
    assert a.name == "ViT-B-32" and a.checkpoints == (str(tmp_path / "ck/epoch_1.pt"), str(tmp_path / "ck/epoch_2.pt"))
    assert a.suites == ("rococo", "karpathy")
    assert b.name == "tiny" and b.model == str(tmp_path / "cfg/tiny.json") and b.checkpoints == (None,)
    assert b.suites == ("toy",)
    assert c.name == "mine" and c.embeddings == str(tmp_path / "e.parquet") and c.model is None


@pytest.mark.parametrize("body, message", [
    ('out = "r"\nsuite = ["toy"]\n', "unknown key 'suite' in the top level (did you mean 'suites'?)"),
    ('out = "r"\nsuites = ["toy"]\n[options]\nbatchsize = 3\n[[model]]\nmodel = "m"\n',
     "unknown key 'batchsize' in [options] (did you mean 'batch_size'?); known keys: search, budget_mb, shard_gallery"),
    ('out = "r"\nsuites = ["toy"]\n[[model]]\nmodel = "m"\ncheckpoint = ["a"]\n',
     "unknown key 'checkpoint' in [[model]] #1 (did you mean 'checkpoints'?)"),
    ('out = "r"\nsuites = ["toy"]\n[options]\nbatch_size = "64"\n[[model]]\nmodel = "m"\n',
     "[options] option 'batch_size' must be an integer, got str '64'"),
    ('out = "r"\nsuites = ["toy"]\n[options]\nseeds = [1, "x"]\n[[model]]\nmodel = "m"\n',
     "[options] option 'seeds' must be a list of integers, got str 'x'"),
    ('out = "r"\nsuites = ["toy"]\n[options]\nprecision = "fp8"\n[[model]]\nmodel = "m"\n',
     "[options] option precision (--precision) must be one of ['auto', 'fp32', 'fp16', 'bf16'], got 'fp8'"),
    ('suites = ["toy"]\n[[model]]\nmodel = "m"\n', 'missing key "out"'),
    ('out = "r"\nsuites = ["toy"]\n', "no [[model]] entries"),
    ('out = "r"\nsuites = ["toy"]\n[[model]]\nmodel = "m"\nembeddings = "e.parquet"\n', "exactly one of model"),
    ('out = "r"\n[[model]]\nmodel = "m"\n', "has no suites"),
    ('out = "r"\nsuites = ["toy"]\n[[model]]\nmodel = "m"\n[[model]]\nmodel = "m"\n',
     "two [[model]] entries write to 'm'"),
    ('out = "r"\nsuites = ["toy"]\n[[model]]\nmodel = "m"\ncheckpoints = ["nope/*.pt"]\n', "matches no file"),
    ('out = "r"\nsuites = ["toy"\n', "not valid TOML"),
])
def test_job_file_errors(tmp_path, body, message):
    p = _job(tmp_path, body)
    with pytest.raises(JobFileError) as e:
        load_job(p)
    assert message in str(e.value) and str(p) in str(e.value)


def test_run_bad_job_file_is_a_usage_error(tmp_path, capsys):
    p = _job(tmp_path, 'out = "r"\nsuites = ["toy"]\n[options]\nbatchsize = 3\n[[model]]\nmodel = "m"\n')
    assert main(["run", str(p)]) == 2
    assert "did you mean 'batch_size'" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.toml")]) == 2


def test_run_exit_codes_per_failure_kind(tmp_path, monkeypatch, capsys):
    import hardrank.jobs.grid as grid
    from hardrank.errors import TooManyFailures

    p = _job(tmp_path, 'out = "r"\nsuites = ["toy"]\n[[model]]\nmodel = "a"\n[[model]]\nmodel = "b"\n')
    calls = []

    def fake_entry(job, m, args):
        calls.append(m.name)
        if m.name == "a":
            raise TooManyFailures("12 images could not be read")

    monkeypatch.setattr(grid, "_run_entry", fake_entry)
    assert main(["run", str(p)]) == 4
    assert calls == ["a", "b"]  # the other entries still run
    assert "1 of 2 entries failed: a" in capsys.readouterr().err
    monkeypatch.setattr(grid, "_run_entry", lambda job, m, args: (_ for _ in ()).throw(FileNotFoundError("x.json")))
    assert main(["run", str(p)]) == 3


# -- dry runs --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cliworld")
    w = make_karpathy_world(root, n_images=6)
    w["cfg"] = write_tiny_config(root)
    w["ckpts"] = [save_random_checkpoint(w["cfg"], root / f"tiny_step{i}00.safetensors", i) for i in range(2)]
    return w


def _fill_store(world, store, ckpt):
    """Embed every item for one checkpoint (what a finished run leaves in the store)."""
    from hardrank import EmbeddingStore, ModelSpec, load_model
    from hardrank.embed import embed_tables
    from hardrank.items import Tables
    from hardrank.suites import SuiteOptions, load_suites

    tables = Tables.empty()
    load_suites(["rococo"], tables, SuiteOptions(annotations=str(world["annotations"]), images=str(world["images"]),
                                                 image_variants=("mix_0.9",)))
    m = load_model(ModelSpec(str(world["cfg"]), str(ckpt)))
    embed_tables(tables, [m], [EmbeddingStore(store, m.fingerprint, dim=m.embed_dim, dtype=m.store_dtype)])


def test_eval_dry_run_prints_plan_and_store_hits(world, tmp_path, capsys):
    store = tmp_path / "store"
    _fill_store(world, store, world["ckpts"][0])
    before = sorted(p.name for p in store.iterdir())
    args = ["eval", "--model", str(world["cfg"]), "--checkpoint", *map(str, world["ckpts"]), "--suite", "rococo",
            "--annotations", str(world["annotations"]), "--images", str(world["images"]), "--image-variants",
            "mix_0.9", "--store", str(store), "--out", str(tmp_path / "out"), "--dry-run"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "nothing will be encoded or written (dry run)" in out
    assert "i2t: 6 queries x 61 gallery items, 2 views (original, same_concept)" in out
    assert "t2i: 31 queries x 12 gallery items, 2 views (original, mix_0.9_s1)" in out
    assert "items: 12 images (0 unreadable), 58 texts (distinct normalised captions)" in out
    lines = [l for l in out.splitlines() if "store hits" in l]
    assert "tiny_step000" in lines[0] and "images 12/12, texts 58/58" in lines[0]
    assert "tiny_step100" in lines[1] and "images 0/12, texts 0/58" in lines[1]
    assert "would encode 12 images and 58 texts" in out
    assert not (tmp_path / "out").exists()                            # nothing written
    assert sorted(p.name for p in store.iterdir()) == before          # no store created for step100


def test_run_dry_run_and_data_errors(world, tmp_path, capsys):
    p = _job(tmp_path, f"""
        out = "res"
        suites = ["rococo"]
        [options]
        annotations = "{world['annotations']}"
        images = "{world['images']}"
        store = "store"
        [[model]]
        model = "{world['cfg']}"
        checkpoints = ["{world['ckpts'][0]}"]
    """)
    assert main(["run", str(p), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "plan: 1 suite(s)" in out and "images 0/6" in out
    bad = _job(tmp_path, f"""
        out = "res"
        suites = ["rococo"]
        [options]
        annotations = "missing/coco_karpathy_test.json"
        images = "{world['images']}"
        [[model]]
        model = "{world['cfg']}"
    """)
    assert main(["run", str(bad), "--dry-run"]) == 3
    assert "does not exist" in capsys.readouterr().err


def test_run_evaluates_the_grid_and_report_reads_it(world, tmp_path, capsys):
    p = _job(tmp_path, f"""
        out = "res"
        suites = ["rococo"]
        [options]
        annotations = "{world['annotations']}"
        images = "{world['images']}"
        store = "store"
        batch_size = 5
        [[model]]
        name = "tiny"
        model = "{world['cfg']}"
        checkpoints = {[str(c) for c in world['ckpts']]}
    """)
    assert main(["run", str(p), "--quiet"]) == 0
    assert (tmp_path / "res" / "tiny" / "tiny_step000" / "rococo.json").is_file()
    assert main(["report", str(tmp_path / "res")]) == 0
    assert (tmp_path / "res" / "report" / "report.html").is_file()


def test_job_files_parse_without_tomllib(tmp_path):
    """Python 3.10 has no tomllib: the job-file path falls back to tomli (a dependency there)."""
    import subprocess
    import sys

    p = _job(tmp_path, 'out = "r"\nsuites = ["toy"]\n[options]\nexecutor = "ray"\ndecoder = "dali"\n'
                       '[[model]]\nmodel = "m"\n')
    script = ("import sys\nsys.modules['tomllib'] = None  # as on Python 3.10\n"
              "from hardrank.jobs.grid import load_job, tomllib\n"
              "assert tomllib.__name__ == 'tomli', tomllib\n"
              f"job = load_job({str(p)!r})\n"
              "print(job.models[0].config.embed.executor, job.models[0].config.embed.decoder)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["ray", "dali"], out.stderr[-2000:]


def test_messages_name_only_commands_that_exist():
    """Every `hardrank <command>` and `make <target>` a message or help text mentions exists."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    commands = {name: sp for path, sp in _all_parsers(build_parser()) if len(path) == 2 for name in [path[1]]}
    targets = set(re.findall(r"^([a-z-]+):", (root / "Makefile").read_text(), re.M))
    for folder in ("engine", "jobs", "kernels"):
        for src in (root / folder).rglob("*.py"):
            text = src.read_text()
            for cmd in re.findall(r"[`']hardrank ([a-z][a-z-]*)", text):
                assert cmd in commands, f"{src.name} mentions `hardrank {cmd}`, which does not exist"
            for target in re.findall(r"`make ([a-z][a-z-]*)`", text):
                assert target in targets, f"{src.name} mentions `make {target}`, which does not exist"


def test_job_file_entries_share_one_ray_executor(tmp_path, monkeypatch, capsys):
    """`hardrank run` with executor ray: one runner (one Ray session) serves every model entry and is
    closed once at the end, even when an entry fails; local entries and embeddings entries get none."""
    import hardrank.jobs.grid as grid

    made, seen = [], []

    class FakeRunner:
        closed = 0

        def close(self):
            self.closed += 1

    class FakeRay(RayExecutor):
        def embed_runner(self, models):
            made.append(FakeRunner())
            return made[-1]

    class Report:
        def table_rows(self):
            return []

    def fake_evaluate(cfg, *, progress=None, echo=None, runner=None):
        seen.append((cfg.embed.executor, runner))
        if len(seen) == 2:
            raise ValueError("entry two fails")
        return Report()

    monkeypatch.setitem(executors._KINDS, "ray", FakeRay)
    monkeypatch.setattr(grid, "evaluate", fake_evaluate)
    p = _job(tmp_path, """
        out = "res"
        suites = ["toy"]
        [options]
        executor = "ray"
        [[model]]
        name = "a"
        model = "cfg/a.json"
        [[model]]
        name = "b"
        model = "cfg/b.json"
        [[model]]
        name = "c"
        model = "cfg/c.json"
        [[model]]
        name = "e"
        embeddings = "e.parquet"
    """)
    assert main(["run", str(p)]) != 0  # entry b failed; the others ran
    assert len(made) == 1 and made[0].closed == 1
    assert [r for _, r in seen] == [made[0], made[0], made[0], None]
    assert "entry two fails" in capsys.readouterr().err
