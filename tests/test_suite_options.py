"""Suites own their options (declared beside the loader, registered in one line) and take their own paths.

A suite registered through the registry API with an option of its own gets its flag, job-file key,
Python keyword and help with nothing else touched; a suite option given with suites that do not take it
is refused; ``--data sugarcrepe=DIR`` (and ``[suites.NAME]`` tables, ``data={suite: DIR}``) give one
suite its own path, and the results record what each suite saw.
"""
from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config

import hardrank
from hardrank.config import EvalConfig, SuiteOptions, build, opt, split_per_suite
from hardrank.errors import UsageError
from hardrank.jobs.cli import build_parser, main
from hardrank.jobs.grid import JobFileError, load_job
from hardrank.suites import load_suites, register, unregister
from hardrank.suites.karpathy import load_karpathy


@dataclass(frozen=True)
class EchoOptions:
    """A test suite's own option."""

    echo_word: str = opt("hello", "the word the echo suite writes into its meta", choices=("hello", "bye"))


def load_echo(tables, opts, own: EchoOptions, name: str = "echo"):
    """Karpathy retrieval that records its own option, to see it arrive."""
    suite = load_karpathy(tables, opts, name=name)
    suite.meta["echo_word"] = own.echo_word
    return suite


@pytest.fixture
def echo():
    register("echo", load_echo, EchoOptions, "a test-only suite with an option of its own")
    yield
    unregister("echo")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("model")
    cfg = write_tiny_config(tmp)
    return cfg, save_random_checkpoint(cfg, tmp / "c.safetensors", 0)


def _eval(model, out, *extra) -> list[str]:
    cfg, ckpt = model
    return ["eval", "--model", str(cfg), "--checkpoint", str(ckpt), "--store", str(out.parent / "store"),
            "--out", str(out), "--device", "cpu", "--batch-size", "8", "--quiet", *extra]


def _help(*cmd) -> str:
    return {" ".join(p.prog.split()[1:]): p for p in _walk(build_parser())}[" ".join(cmd)].format_help()


def _walk(p):
    yield p
    for a in p._actions:
        if a.__class__.__name__ == "_SubParsersAction":
            for sp in a.choices.values():
                yield from _walk(sp)


def test_a_registered_suite_option_is_a_flag_a_job_key_a_keyword_and_help(echo, model, tmp_path, capsys):
    w = make_karpathy_world(tmp_path / "w", n_images=4)
    paths = ["--annotations", str(w["annotations"]), "--images", str(w["images"])]
    # the flag, under the suite's own heading, in eval's help, the job file's keys and store export
    text = _help("eval")
    assert "suite echo:" in text and "--echo-word {hello,bye}" in text
    assert "echo  " in text and "its own options: --echo-word" in text  # the suites listing: its help line
    assert "echo_word" in _help("run") and "--echo-word" in _help("store", "export")
    assert main(_eval(model, tmp_path / "o1", "--suite", "echo", "--echo-word", "bye", *paths)) == 0
    res = json.loads((tmp_path / "o1" / "c" / "echo.json").read_text())
    assert res["suite_meta"]["echo_word"] == "bye" and res["provenance"]["suite_options"]["echo_word"] == "bye"
    # the Python keyword
    cfg, ckpt = model
    hardrank.evaluate(model=str(cfg), checkpoints=[str(ckpt)], suites=["echo"], echo_word="bye",
                      annotations=str(w["annotations"]), images=str(w["images"]), out=str(tmp_path / "o2"),
                      store=str(tmp_path / "store"), device="cpu")
    assert json.loads((tmp_path / "o2" / "c" / "echo.json").read_text())["suite_meta"]["echo_word"] == "bye"
    # the job-file key, in [options] and in the suite's own table
    job = tmp_path / "job.toml"
    job.write_text('out = "r"\nsuites = ["echo"]\n[options]\necho_word = "bye"\n[[model]]\nmodel = "m"\n')
    assert load_job(job).models[0].config.suite_options.own_options("echo").echo_word == "bye"
    job.write_text('out = "r"\n[suites.echo]\necho_word = "bye"\n[[model]]\nmodel = "m"\n')
    assert load_job(job).models[0].config.suite_options.own_options("echo").echo_word == "bye"
    # its choices are checked; its default holds when it is not given
    with pytest.raises(SystemExit) as e:  # argparse's own usage error, from the declared choices
        main(_eval(model, tmp_path / "o3", "--suite", "echo", "--echo-word", "maybe", *paths))
    assert e.value.code == 2 and "invalid choice: 'maybe'" in capsys.readouterr().err
    with pytest.raises(UsageError, match=r"echo_word \(--echo-word\) must be one of \['hello', 'bye'\]"):
        build(EvalConfig, {"suites": ["echo"], "echo_word": "maybe", "out": "x"})
    assert build(EvalConfig, {"suites": ["echo"], "out": "x"}).suite_options.own_options("echo").echo_word == "hello"
    capsys.readouterr()


def test_an_unregistered_suite_option_is_gone(echo):
    unregister("echo")
    try:
        assert "--echo-word" not in _help("eval")
        with pytest.raises(UsageError, match=r"unknown option 'echo_word'"):
            build(EvalConfig, {"suites": ["karpathy"], "echo_word": "bye", "out": "x"})
    finally:
        register("echo", load_echo, EchoOptions)


def test_a_suite_option_given_with_other_suites_is_refused(tmp_path, capsys):
    ann = tmp_path / "captions.jsonl"
    ann.write_text("")
    assert main(["eval", "--suite", "karpathy", "--language", "de", "--embeddings", "e.parquet",
                 "--annotations", str(ann), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "option languages (--language) is for suites xm3600; this run's suites are karpathy" in err
    with pytest.raises(UsageError, match=r"classnames \(--classnames\) is for suites imagefolder, classification"):
        hardrank.plan(suites=["toy"], classnames="names.txt", embeddings="e.parquet", out="x")
    with pytest.raises(UsageError, match=r"option languages \(--language\) is for suites xm3600, not sugarcrepe"):
        build(EvalConfig, {"suites": ["sugarcrepe"], "per_suite": {"sugarcrepe": {"languages": ["de"]}}, "out": "x"})
    # an unknown option still names the closest known one
    with pytest.raises(UsageError, match=r"unknown option 'langauges' \(did you mean 'languages'\?\)"):
        build(EvalConfig, {"suites": ["xm3600"], "langauges": ["de"], "out": "x"})


def test_an_option_name_is_declared_once():
    @dataclass(frozen=True)
    class Clash:
        languages: tuple[str, ...] | None = opt(None, "another suite's languages")

    @dataclass(frozen=True)
    class Common:
        data: str | None = opt(None, "a shared option's name")

    with pytest.raises(ValueError, match=r"option 'languages' is declared already by suite 'xm3600'"):
        register("clash", load_echo, Clash)
    register("common", load_echo, Common)
    try:
        with pytest.raises(ValueError, match=r"option name\(s\) \['data'\] declared twice"):
            build(EvalConfig, {"suites": ["common"], "out": "x"})
    finally:
        unregister("common")


# -- per-suite paths ----------------------------------------------------------------------------------------
def _split(value):
    f = next(f for f in SuiteOptions.__dataclass_fields__.values() if f.name == "data")
    return split_per_suite(f, value)


def test_the_suite_path_grammar(tmp_path, monkeypatch):
    assert _split(["D", "sugarcrepe=S", "aro=A=B"]) == ("D", [("sugarcrepe", "S"), ("aro", "A=B")])
    assert _split("toy=W") == (None, [("toy", "W")])  # an alias: each of its suites
    # no suite name before '=': a plain value (Windows paths, URLs, folders)
    for plain in (r"C:\data=1", "s3://bucket/k=v", "https://h/x?a=b", "data/aro=1", "./sugarcrep=x", "/abs/aro=1"):
        assert _split(plain) == (plain, []), plain
    assert _split(Path("sugarcrepe=x")) == ("sugarcrepe=x", [])  # a Path is a path
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weird=1").mkdir()
    assert _split("weird=1") == ("weird=1", [])  # an existing path holding '='
    with pytest.raises(UsageError, match=r"'sugarcrep=x' is SUITE=PATH .* 'sugarcrep' names no suite \(did you "
                                         r"mean 'sugarcrepe'\?\); suites: amodal, aro, .*written \./sugarcrep=x"):
        _split("sugarcrep=x")
    with pytest.raises(UsageError, match=r"gives suite aro no value"):
        _split("aro=")
    with pytest.raises(UsageError, match=r"two values for every suite, 'D' and 'E'"):
        _split(["D", "E"])
    with pytest.raises(UsageError, match=r"gives suite aro two values"):
        _split(["aro=1", "aro=2"])
    with pytest.raises(UsageError, match=r"'sugarcrep' names no suite .*; suites: amodal, aro"):
        _split({"sugarcrep": "x"})


def test_per_suite_values_reach_their_suite_only():
    cfg = build(EvalConfig, {"suites": ["sugarcrepe", "aro", "toy"], "data": ["D", "sugarcrepe=S", "toy=W"],
                             "images": {"aro": "I"}, "out": "x",
                             "per_suite": {"toy-rococo": {"data": "R", "tie_rule": "optimistic"}}})
    so = cfg.suite_options
    data = [so.for_suite(n).data for n in ("sugarcrepe", "aro", "toy-inpaint")]
    assert data == ["S", "D", "W"]
    assert so.for_suite("toy-rococo").data == "R" and so.for_suite("toy-rococo").tie_rule == "optimistic"
    assert (so.for_suite("aro").images, so.for_suite("sugarcrepe").images) == ("I", None)
    assert so.for_suite("sugarcrepe").tie_rule == "index"
    with pytest.raises(UsageError, match=r"option data is given for suite aro, which this run does not evaluate "
                                         r"\(its suites: sugarcrepe\)"):
        build(EvalConfig, {"suites": ["sugarcrepe"], "data": "aro=A", "out": "x"})
    with pytest.raises(UsageError, match=r"per-suite options: 'aroo' names no suite \(did you mean 'aro'\?\)"):
        build(EvalConfig, {"suites": ["aro"], "per_suite": {"aroo": {"data": "A"}}, "out": "x"})


def test_two_suites_with_their_own_data_in_one_command(model, tmp_path, capsys):
    a = make_karpathy_world(tmp_path / "a", n_images=4)
    b = make_karpathy_world(tmp_path / "b", n_images=6, seed=1)
    assert main(_eval(model, tmp_path / "out", "--suite", "karpathy", "coco_order",
                      "--annotations", f"karpathy={a['annotations']}", f"coco_order={b['annotations']}",
                      "--images", str(a["images"]), f"coco_order={b['images']}")) == 0
    k = json.loads((tmp_path / "out" / "c" / "karpathy.json").read_text())
    o = json.loads((tmp_path / "out" / "c" / "coco_order.json").read_text())
    assert k["suite_meta"]["images"] == 4 and o["suite_meta"]["images"] == 6
    assert k["provenance"]["suite_options"]["annotations"] == str(a["annotations"])
    assert o["provenance"]["suite_options"]["annotations"] == str(b["annotations"])
    assert (k["provenance"]["suite_options"]["images"], o["provenance"]["suite_options"]["images"]) == \
        (str(a["images"]), str(b["images"]))
    # the dry run names each suite's inputs
    assert main(_eval(model, tmp_path / "out", "--suite", "karpathy", "coco_order", "--dry-run",
                      "--annotations", f"karpathy={a['annotations']}", f"coco_order={b['annotations']}",
                      "--images", str(a["images"]), f"coco_order={b['images']}")) == 0
    plan = capsys.readouterr().out
    assert f"  coco_order  (images {b['images']}, annotations {b['annotations']})" in plan


def test_job_file_suite_tables(tmp_path):
    job = tmp_path / "sub" / "job.toml"
    job.parent.mkdir()
    job.write_text(textwrap.dedent("""
        out = "r"
        [suites.sugarcrepe]
        data = "sc"
        images = "/coco"
        [suites.aro]
        data = "aro"
        [suites.xm3600]
        languages = ["de"]
        [options]
        images = "imgs"
        annotations = {xm3600 = "xm/captions.jsonl"}
        [[model]]
        model = "m"
        [[model]]
        name = "only-aro"
        model = "m"
        suites = ["aro"]
    """))
    everything, only_aro = load_job(job).models
    base = job.parent
    so = everything.config.suite_options
    assert everything.suites == ("sugarcrepe", "aro", "xm3600")
    assert (so.for_suite("sugarcrepe").data, so.for_suite("sugarcrepe").images) == (str(base / "sc"), "/coco")
    assert (so.for_suite("aro").data, so.for_suite("aro").images) == (str(base / "aro"), str(base / "imgs"))
    assert so.for_suite("xm3600").annotations == str(base / "xm" / "captions.jsonl")
    assert so.own_options("xm3600").languages == ("de",)
    # an entry gets the values of its own suites only: xm3600's language and the other tables stay with them
    so = only_aro.config.suite_options
    assert so.own == () and {s for s, _, _ in so.per_suite} == {"aro"}
    for body, message in [
        ('out = "r"\n[suites.sugarcrep]\ndata = "x"\n[[model]]\nmodel = "m"\n',
         "[suites.sugarcrep]: no suite is named 'sugarcrep' (did you mean 'sugarcrepe'?); suites: amodal, aro"),
        ('out = "r"\n[suites.aro]\ndat = "x"\n[[model]]\nmodel = "m"\n',
         "unknown key 'dat' in [suites.aro] (did you mean 'data'?)"),
        ('out = "r"\n[suites.aro]\nlanguages = ["de"]\n[[model]]\nmodel = "m"\n',
         "option languages (--language) is for suites xm3600, not aro"),
        ('out = "r"\nsuites = ["aro"]\n[options]\nlanguages = ["de"]\n[[model]]\nmodel = "m"\n',
         "[options] option languages (--language) is for suites xm3600; this run's suites are aro"),
        ('out = "r"\nsuites = ["aro"]\n[options]\ndata = {sugarcrepe = "x"}\n[[model]]\nmodel = "m"\n',
         "option data is given for suite sugarcrepe, which this run does not evaluate"),
    ]:
        job.write_text(body)
        with pytest.raises(JobFileError) as e:
            load_job(job)
        assert message in str(e.value) and str(job) in str(e.value), str(e.value)


def test_each_suite_loads_with_what_it_was_given(tmp_path):
    a = make_karpathy_world(tmp_path / "a", n_images=4)
    b = make_karpathy_world(tmp_path / "b", n_images=6, seed=1)
    opts = build(SuiteOptions, {"annotations": [str(a["annotations"]), f"rococo={b['annotations']}"]})
    karpathy, rococo = load_suites(["karpathy", "rococo"], hardrank.Tables.empty(), opts)
    assert (karpathy.meta["images"], rococo.meta["images"]) == (4, 6)
    assert rococo.options["annotations"] == str(b["annotations"]) and "languages" not in rococo.options
