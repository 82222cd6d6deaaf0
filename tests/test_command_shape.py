"""One shape per command: each sub-command's flags are the options of its config dataclass (plus the
few command-line-only flags in ``jobs/flags.py``), its help names only flags it has, the engine entry
points take those configs, and model specs and the store check are built in one place each."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import re
from pathlib import Path

import pytest

import hardrank
from hardrank.config import EvalConfig, IndexBuildConfig, MineConfig, MineOptions, flat_fields
from hardrank.errors import UsageError
from hardrank.jobs.bench import KernelBenchConfig, PipelineBenchConfig
from hardrank.jobs.cli import build_parser, main
from hardrank.jobs.flags import CLI_FLAGS, CONFIG_CLASS, options_from_args
from hardrank.suites import ALIASES, SUITES, register, unregister

ROOT = Path(__file__).resolve().parent.parent


def _parsers(p: argparse.ArgumentParser, path=("hardrank",)):
    yield " ".join(path), p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items():
                yield from _parsers(sp, (*path, name))


def _has_sub(p) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in p._actions)


def _actions(p):
    return [a for a in p._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def _flags(p) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


PARSERS = dict(_parsers(build_parser()))
COMMANDS = {cmd: p for cmd, p in PARSERS.items() if not _has_sub(p)}

# the commands whose config is an engine entry point's (or a bench's): pinned, so a command cannot
# drift to a config of its own making
ENGINE_CONFIGS = {
    "hardrank eval": EvalConfig, "hardrank mine": MineConfig, "hardrank index build": IndexBuildConfig,
    "hardrank attack texts": hardrank.AttackTextsConfig, "hardrank attack images": hardrank.AttackImagesConfig,
    "hardrank perturb texts": hardrank.PerturbTextsConfig, "hardrank perturb images": hardrank.PerturbImagesConfig,
    "hardrank bench kernels": KernelBenchConfig, "hardrank bench pipeline": PipelineBenchConfig,
}


def test_every_command_is_walked():
    assert {"hardrank toy world", "hardrank toy shards", "hardrank toy train", "hardrank store list",
            "hardrank store export", "hardrank perturb images", "hardrank attack texts", "hardrank bench kernels",
            "hardrank watch", "hardrank demo", "hardrank run", "hardrank report", "hardrank export"} <= set(COMMANDS)


def test_every_flag_is_an_option_of_the_commands_config_dataclass():
    for cmd, p in PARSERS.items():
        cls = p.get_default(CONFIG_CLASS)
        options = {a for a in _actions(p) if a.dest not in CLI_FLAGS}
        if cmd in COMMANDS:
            assert cls is not None and dataclasses.is_dataclass(cls), f"`{cmd}` names no config dataclass"
        if cmd in ENGINE_CONFIGS:
            assert cls is ENGINE_CONFIGS[cmd], (cmd, cls)
        if not options:
            continue
        fields = {name: f for name, f, _ in flat_fields(cls)}
        for a in _actions(p):
            if a.dest in CLI_FLAGS:  # the documented command-line-only flags, spelled as documented
                assert tuple(a.option_strings) == CLI_FLAGS[a.dest][0], (cmd, a.option_strings)
                continue
            shown = "/".join(a.option_strings) or a.metavar
            assert a.dest in fields, f"`{cmd}` flag {shown} is no option of {cls.__name__}"
            f = fields[a.dest]
            assert f.metadata.get("cli", True), f"`{cmd}` shows {shown}, an option kept off the command line"
            if a.option_strings:  # the flag the field declares (or --name), as the generator spells it
                assert (f.metadata.get("flag") or "--" + a.dest.replace("_", "-")) in a.option_strings, (cmd, shown)


@pytest.mark.parametrize("cmd, foreign", [
    ("hardrank store export", {"--shard-gallery", "--shard-gallery-above-mb", "--rank-precision", "--search",
                               "--budget-mb", "--tie-rule", "--embeddings", "--executor", "--batch-size"}),
    ("hardrank watch", {"--checkpoint", "--pretrained", "--random-init", "--run", "--embeddings"}),
    ("hardrank demo", {"--suite", "--model", "--checkpoint", "--data", "--images", "--captions", "--search"}),
    ("hardrank bench pipeline", {"--store", "--executor", "--decoder", "--tie-rule"}),
    ("hardrank perturb images", {"--model", "--store", "--device"}),
    ("hardrank toy world", {"--world", "--per-shard"}),
])
def test_no_foreign_flags(cmd, foreign):
    assert not _flags(COMMANDS[cmd]) & foreign, sorted(_flags(COMMANDS[cmd]) & foreign)


def _prose(p: argparse.ArgumentParser) -> str:
    """What a command's help says in words: description, flag and sub-command help, the epilog up to
    its examples; `quoted` spans (other commands' lines) left out."""
    texts = [p.description or "", (p.epilog or "").split("examples:")[0]]
    for a in p._actions:
        texts.append(a.help or "")
        if isinstance(a, argparse._SubParsersAction):
            texts += [c.help or "" for c in a._choices_actions]
    return re.sub(r"`[^`]*`", "", "\n".join(texts))


def test_help_names_only_flags_the_command_has():
    for cmd, p in PARSERS.items():
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9]", _prose(p)))
        assert named <= _flags(p), f"`{cmd} --help` mentions {sorted(named - _flags(p))}, which it does not take"


def test_suite_help_lists_the_suite_registry(monkeypatch):
    for cmd in ("hardrank eval", "hardrank watch", "hardrank store export", "hardrank bench pipeline"):
        (a,) = [a for a in _actions(COMMANDS[cmd]) if a.dest == "suites"]
        assert "--suite" in a.option_strings
        for name in [*SUITES, *ALIASES]:
            assert name in a.help, (cmd, name)
    register("my_suite", lambda tables, opts, name: None)  # a suite registered later is listed too
    try:
        p = dict(_parsers(build_parser()))["hardrank eval"]
        assert "my_suite" in next(a.help for a in _actions(p) if a.dest == "suites")
    finally:
        unregister("my_suite")


def _calls(name: str) -> list[str]:
    """file:line of every call of ``name`` in the engine and the CLI."""
    out = []
    for folder in ("engine", "jobs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    f = node.func
                    if (f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)) == name:
                        out.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return out


def test_model_specs_are_built_in_one_place():
    """--model/--checkpoint/--pretrained/... become ModelSpecs in hardrank.models.runs only
    (``user_specs``; ``run_spec`` for training runs; ``object_spec`` for a model object), whatever the command;
    the spelling itself is parsed by ModelSpec (``hardrank.models.spec``)."""
    places = _calls("ModelSpec")
    assert places and all(p.startswith("engine/models/runs.py:") for p in places), places
    assert len(_calls("user_specs")) >= 6  # eval (model_specs), mine, the pipeline, perturb, attack, bench naive


def test_the_store_check_is_one_helper():
    """The --store usage check is written once (EmbedOptions.check_store), used by eval, mine and attack."""
    holders = [str(p.relative_to(ROOT)) for folder in ("engine", "jobs") for p in (ROOT / folder).rglob("*.py")
               if '"store (--store)"' in p.read_text()]
    assert holders == ["engine/config.py"], holders
    users = {c.split(":")[0] for c in _calls("check_store")}
    assert {"engine/evaluate.py", "engine/mining/run.py", "engine/attack_run.py"} <= users, users


# -- the commands' configs, behind the flags ---------------------------------------------------------------

def test_attack_cli_hands_its_flags_to_the_engine_entry_point(tmp_path, monkeypatch, capsys):
    import hardrank.jobs.cmd_attack as cmd

    seen = []

    def fake(cfg, *, progress=None, echo=None):
        seen.append(cfg)
        return {"checkpoints": []}

    monkeypatch.setattr(cmd, "attack_texts", fake)
    monkeypatch.setattr(cmd, "attack_images", fake)
    for n in ("b", "a"):
        (tmp_path / f"{n}.pt").write_bytes(b"")
    common = ["--model", "m", "--checkpoint", str(tmp_path / "*.pt"), "--annotations", "k.json", "--images", "im",
              "--out", str(tmp_path / "o"), "--store", str(tmp_path / "s"), "--batch-size", "7", "--quiet"]
    assert main(["attack", "texts", *common, "--budget", "3", "--positions", "noun", "colour",
                 "--concepts", "none"]) == 0
    assert main(["attack", "images", *common, "-k", "2", "--method", "patch", "--lam", "0.5"]) == 0
    t, i = seen
    assert isinstance(t, hardrank.AttackTextsConfig) and isinstance(i, hardrank.AttackImagesConfig)
    assert t.checkpoints == (str(tmp_path / "a.pt"), str(tmp_path / "b.pt"))  # globs expanded, sorted
    assert (t.budget, t.positions, t.concepts, t.embed.batch_size) == (3, ("noun", "colour"), "none", 7)
    assert (i.k, i.method, i.lam, i.embed.store) == (2, "patch", 0.5, str(tmp_path / "s"))


def test_attack_configs_check_their_options_before_any_work(tmp_path, capsys):
    base = {"model": "m", "annotations": str(tmp_path / "missing.json"), "images": str(tmp_path), "out": str(tmp_path)}
    with pytest.raises(UsageError, match=r"lam \(--lam\) must be in \[0, 1\]"):
        hardrank.AttackImagesConfig(**base, lam=1.5)
    with pytest.raises(UsageError, match=r"option budget \(--budget\) must be a number >= 1"):
        hardrank.AttackTextsConfig(**base, budget=0)
    with pytest.raises(UsageError, match=r"positions \(--positions\) takes values of"):
        hardrank.AttackTextsConfig(**base, positions=("noun", "verb"))
    with pytest.raises(UsageError, match=r"option model \(--model\) is required"):
        hardrank.AttackTextsConfig(**{**base, "model": ""})
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=r"store \(--store\)"):  # before the (missing) annotations are read
        hardrank.attack_texts(**base, store=str(tmp_path / "file"), concepts="none")
    assert main(["attack", "images", "--model", "m", "--annotations", "a.json", "--images", str(tmp_path), "--out",
                 str(tmp_path / "o"), "--quality", "0"]) == 2
    assert "quality (--quality) must be in [1, 100]" in capsys.readouterr().err


def test_perturb_images_bad_options_are_usage_errors(tmp_path, capsys):
    assert main(["perturb", "images", "--method", "mix", "--lam", "1.5", "--images", str(tmp_path), "--annotations",
                 "a.json", "--out", str(tmp_path)]) == 2
    assert "lam (--lam) must be in [0, 1]" in capsys.readouterr().err
    assert main(["perturb", "images", "--method", "mix", "--images", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "needs --annotations" in capsys.readouterr().err
    with pytest.raises(UsageError, match=r"kinds \(--kinds\) takes values of"):
        hardrank.PerturbTextsConfig(model="m", annotations="a.json", out="o", kinds=("danger", "nope"))


def test_kernel_bench_flags_come_from_its_config():
    args = build_parser().parse_args(["bench", "kernels", "--no-warmup", "--skip", "faiss", "onehot", "--nq", "7"])
    cfg = options_from_args(KernelBenchConfig, args)
    assert (cfg.warmup, cfg.skip, cfg.nq, cfg.nb) == (False, ("faiss", "onehot"), 7, 25010)
    with pytest.raises(UsageError, match="--baseline-queries must be >= 1, got 0"):
        KernelBenchConfig(baseline_queries=0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "kernels", "--skip", "nothing"])


def test_no_dup_filter_is_an_option():
    assert MineOptions(dup_filter=False).dup_threshold is None and MineOptions().dup_threshold == 0.95
    args = build_parser().parse_args(["mine", "--corpus", "c", "--queries", "q", "--out", "o", "--no-dup-filter"])
    assert options_from_args(MineConfig, args).options.dup_threshold is None


def test_positional_options(tmp_path, capsys):
    args = build_parser().parse_args(["store", "export", "fp_dir", "--suite", "toy", "--out", "e.parquet"])
    cfg = options_from_args(args.config_class, args)
    assert (cfg.folder, cfg.file, cfg.evaluation.suites) == ("fp_dir", "e.parquet", ("toy",))
    args = build_parser().parse_args(["watch", "logs/exp1", "--suite", "toy", "--out", "r", "--once"])
    cfg = options_from_args(args.config_class, args)
    assert (cfg.evaluation.run, cfg.once, cfg.report) == ("logs/exp1", True, True)
    assert main(["report", str(tmp_path), "--top", "-1"]) == 2
    assert "top (--top) must be a number >= 0, got -1" in capsys.readouterr().err
