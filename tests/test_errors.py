"""The exit code of each error kind, and no plain ValueError left where the user could act on the error."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import hardrank.jobs.cli as cli
import hardrank.jobs.cmd_toy as cmd_toy
from hardrank.errors import (
    DataError,
    HardrankError,
    MissingExtra,
    TooManyFailures,
    UsageError,
    exit_code,
)
from hardrank.formats.annotations import SuiteFormatError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("exc, code", [
    (UsageError("option batch_size (--batch-size) must be a number >= 1, got 0"), 2),
    (DataError("a.json: item 3 lacks key(s) ['caption']"), 3),
    (SuiteFormatError("a.json: not valid JSON"), 3),  # kinds of DataError keep its code
    (TooManyFailures("12 images could not be read"), 4),
    (MissingExtra("--executor ray", "ray", "ray"), 1),
    (HardrankError("no kind"), 1),
    # Python's own errors about an input path: bad data
    (FileNotFoundError(2, "No such file or directory", "a.json"), 3),
    (NotADirectoryError(20, "Not a directory", "a.json/images"), 3),
    (IsADirectoryError(21, "Is a directory", "images"), 3),
    (PermissionError(13, "Permission denied", "a.json"), 3),
    # anything else is a bug, a plain ValueError or KeyError included (they were 3 before)
    (ValueError("group_bounds do not partition the gallery"), 1),
    (KeyError("image"), 1),
    (json.JSONDecodeError("Expecting value", "", 0), 1),
    (TypeError("x"), 1),
    (RuntimeError("x"), 1),
    (AssertionError("x"), 1),
    (OSError("disk on fire"), 1),
], ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_exit_code_of_each_kind(exc, code):
    assert exit_code(exc) == code


def test_usage_and_data_errors_are_still_value_errors():
    # callers (and users' scripts) that catch ValueError keep working
    assert issubclass(UsageError, ValueError) and issubclass(DataError, ValueError)


@pytest.mark.parametrize("exc, code, shown", [
    (UsageError("option x is bad"), 2, "hardrank: error: option x is bad"),
    (DataError("a.json: bad"), 3, "hardrank: error: a.json: bad"),
    (FileNotFoundError("a.json does not exist"), 3, "hardrank: error: a.json does not exist"),
    (PermissionError(13, "Permission denied", "a.json"), 3, "Permission denied: 'a.json'"),
    (TooManyFailures("12 images could not be read"), 4, "hardrank: stopped: 12 images"),
    (KeyboardInterrupt(), 130, "hardrank: interrupted; finished work is kept"),
])
def test_main_returns_the_code_and_one_line(monkeypatch, capsys, exc, code, shown):
    def raising(args):
        raise exc

    monkeypatch.setattr(cmd_toy, "_cmd_world", raising)  # `hardrank toy world` then raises it
    assert cli.main(["toy", "world", "--out", "unused"]) == code
    err = capsys.readouterr().err
    assert shown in err and "Traceback" not in err


@pytest.mark.parametrize("exc", [ValueError("internal invariant"), KeyError("k")])
def test_main_lets_a_bug_raise(monkeypatch, exc):
    """A plain ValueError or KeyError is a bug: main does not turn it into a one-line 'bad data' (3); it
    propagates, so Python prints its traceback and exits 1."""
    def raising(args):
        raise exc

    monkeypatch.setattr(cmd_toy, "_cmd_world", raising)
    with pytest.raises(type(exc)):
        cli.main(["toy", "world", "--out", "unused"])


# -- a library's parse error on a user's file is DataError naming the file (it was a plain ValueError, 3) -----
NOT_JSON, LATIN1 = b"not json", '["caf\xe9"]'.encode("latin-1")


def _model_config(tmp_path, content):
    from hardrank.models.openclip import resolve_arch

    (tmp_path / "model.json").write_bytes(content)
    resolve_arch(str(tmp_path / "model.json"))


def _local_dir(tmp_path, content):
    from hardrank.models import ModelSpec, load_model

    (tmp_path / "open_clip_config.json").write_bytes(content)
    load_model(ModelSpec(f"local-dir:{tmp_path}", None, device="cpu"))


def _inpaintcoco(tmp_path, content):
    from hardrank.items import Tables
    from hardrank.suites import SuiteOptions, load_suites

    (tmp_path / "test.parquet").write_bytes(content)
    load_suites(["inpaintcoco"], Tables.empty(), SuiteOptions(data=str(tmp_path / "test.parquet")))


def _img2dataset_parquet(tmp_path, content):
    from hardrank.inputs.webdataset import read_samples

    (tmp_path / "00000.parquet").write_bytes(content)
    read_samples(str(tmp_path / "00000.parquet"))


def _attack_vocab(tmp_path, content):
    from hardrank.perturb.attack import vocab_from_file

    (tmp_path / "words.txt").write_bytes(content)
    vocab_from_file(tmp_path / "words.txt")


def _perturb_vocab(tmp_path, content):
    from hardrank.perturb.texts import load_vocab

    (tmp_path / "vocab.json").write_bytes(content)
    load_vocab(tmp_path / "vocab.json")


@pytest.mark.parametrize("read, name, content", [
    (_model_config, "model.json", NOT_JSON), (_model_config, "model.json", LATIN1),
    (_local_dir, "open_clip_config.json", NOT_JSON),
    (_inpaintcoco, "test.parquet", b"PAR1 not parquet PAR1"),
    (_img2dataset_parquet, "00000.parquet", b"PAR1 not parquet PAR1"),
    (_attack_vocab, "words.txt", LATIN1),
    (_perturb_vocab, "vocab.json", NOT_JSON), (_perturb_vocab, "vocab.json", LATIN1),
], ids=lambda v: getattr(v, "__name__", None) or (None if isinstance(v, bytes) else str(v)))
def test_unparsable_input_files_are_data_errors_naming_the_file(tmp_path, read, name, content):
    with pytest.raises(DataError) as e:
        read(tmp_path, content)
    assert str(tmp_path / name) in str(e.value)


def test_unparsable_mining_listing_exits_3(tmp_path, capsys):
    bad = tmp_path / "listing.parquet"
    bad.write_bytes(b"PAR1 not parquet PAR1")
    assert cli.main(["mine", "--corpus", str(bad), "--queries", str(bad), "--direction", "t2t",
                     "--out", str(tmp_path / "out"), "--quiet"]) == 3
    assert f"{bad}: not a readable Parquet file" in capsys.readouterr().err


def test_a_store_folder_that_is_a_file_is_a_usage_error(tmp_path):
    from hardrank.store.embedding_store import EmbeddingStore

    (tmp_path / "fp").write_text("x")  # the same refusal as the --store check up front: exit 2, naming --store
    with pytest.raises(UsageError, match="is a file; pass a --store folder"):
        EmbeddingStore(tmp_path, "fp", dim=4, dtype="float16")


# -- no plain ValueError where the user can act ------------------------------------------------------
# The raises of a plain ValueError left in engine/ and jobs/: each is an internal invariant, a caller bug
# (exit 1), never reachable from a flag, a job file or an input file (those raise UsageError / DataError),
# as (file, function) -> how many. kernels/ is not checked: pure torch, its argument checks are its API.
ALLOWED_VALUE_ERRORS = {
    # invariants of the structures the suite loaders and mining inputs build (checked as they are made)
    ("engine/tasks.py", "RankingTask.validate"): 4,
    ("engine/tasks.py", "ChoiceTask.validate"): 5,  # with the per-row fields of first_rank and multilabel rows
    ("engine/tasks.py", "ClassifyTask.validate"): 3,
    ("engine/tasks.py", "ProbeTask.validate"): 2,
    ("engine/tasks.py", "RankingTask.keep_units"): 1,  # a lite subset of a task its loader built without units
    ("jobs/cli.py", "_add_command"): 1,  # a name in jobs/commands.py COMMANDS with no module to build its parser
    ("engine/suites/classification.py", "_label"): 1,  # caught on the next line: the DataError naming the row
    ("engine/suites/karpathy.py", "build_retrieval"): 1,  # query variants are chosen among the image variants
    ("engine/mining/problem.py", "MineProblem.validate"): 8,
    ("engine/scoring/choice_macro.py", "ChoiceAggregate.__post_init__"): 3,  # specs written in suite loaders
    ("engine/scoring/choice_macro.py", "aggregate_accuracy"): 1,
    ("engine/scoring/choice_macro.py", "suite_aggregates"): 1,
    # shapes / CSR pointers of arrays passed between hardrank's own stages (user arrays are checked where
    # they are read: inputs/embedding_files.py, inputs/clip_retrieval.py, the store's checksums)
    ("engine/scoring/faiss_index/__init__.py", "_as_matrix"): 2,
    ("engine/vectors.py", "UnitRows.of"): 1,  # made by the embeddings reader of the float16 arrays it allocates
    ("engine/scoring/faiss_index/__init__.py", "_csr"): 2,
    ("engine/scoring/faiss_index/__init__.py", "recall_at_k"): 1,
    ("engine/scoring/faiss_index/__init__.py", "faiss_grouped_ranks"): 2,
    ("engine/scoring/mask_score.py", "clip_regions"): 2,
    ("engine/encoding/job.py", "EmbedSink.add"): 1,
    ("engine/store/embedding_store.py", "EmbeddingStore.write"): 1,
    ("engine/store/memory.py", "MemoryStore.write"): 1,  # (as EmbeddingStore.write: the sink's shapes)
    ("engine/store/key_index.py", "as_string_array"): 1,  # a shard's null keys: caught there, shard quarantined
    ("engine/store/key_index.py", "KeyIndex._append"): 1,
    ("engine/items.py", "ItemTable.set_keys"): 1,
    ("engine/perturb/attack.py", "own_scores"): 1,
    ("engine/formats/masks.py", "rle_encode"): 1,  # writes the toy world's masks
    # a value already checked upstream (the task's rule, the perturbation method) or made by the toy world
    ("engine/scoring/metrics.py", "choice_verdicts"): 1,
    ("engine/scoring/metrics.py", "_summarise"): 1,
    ("engine/text.py", "caption_normaliser"): 1,  # --caption-protocol's choices are checked by the option
    ("engine/scoring/rerank.py", "rescored_ranks"): 2,  # the tie rule (an option's choice), the task's positives
    # the processor's settings fix its output shapes (checked when the model loads); a change is a bug
    ("engine/encoding/decode.py", "ProcessorDecoder._arrays"): 1,
    ("engine/perturb/images.py", "_alter_batch"): 2,
    ("engine/toyworld/scenes.py", "render"): 1,
    ("engine/toyworld/variants.py", "perturb_caption"): 2,
    # a plugin author's misuse of a registry, or a programmer's of a helper: Python API errors, not user input
    ("engine/inputs/registry.py", "register"): 3,
    ("engine/scoring/backends/__init__.py", "register"): 1,
    ("engine/suite_registry.py", "register"): 3,  # a taken name, options no frozen dataclass, an option declared twice
    ("engine/suite_registry.py", "alias"): 1,
    ("engine/models/spec.py", "register_kind"): 3,  # a taken name, an overlapping prefix, a second catch-all kind
    ("engine/config.py", "build"): 1,  # a suite registered an option named as a shared one (found where both meet)
    ("jobs/flags.py", "add_options"): 2,
    ("jobs/bench/timing.py", "PeakRSS.__init__"): 1,
}


def _value_error_raises() -> dict[tuple[str, str], list[int]]:
    """(file, qualified function) -> lines of each ``raise ValueError`` in engine/ and jobs/."""
    found: dict[tuple[str, str], list[int]] = {}
    for folder in ("engine", "jobs"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()

            def walk(node, scope):
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        walk(child, [*scope, child.name])
                        continue
                    if isinstance(child, ast.Raise) and child.exc is not None:
                        exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                        if isinstance(exc, ast.Name) and exc.id == "ValueError" or \
                                isinstance(exc, ast.Attribute) and exc.attr == "ValueError":
                            found.setdefault((rel, ".".join(scope) or "<module>"), []).append(child.lineno)
                    walk(child, scope)

            walk(ast.parse(path.read_text(), rel), [])
    return found


def test_no_plain_value_error_outside_the_allow_list():
    found = _value_error_raises()
    extra = {f"{f}:{lines[0]} ({fn})": len(lines) for (f, fn), lines in found.items()
             if len(lines) > ALLOWED_VALUE_ERRORS.get((f, fn), 0)}
    assert not extra, (f"plain `raise ValueError` in {sorted(extra)}: a plain ValueError exits 1 (a bug). Raise "
                       f"hardrank.errors.UsageError for a bad flag/option/keyword (exit 2) or DataError for a bad "
                       f"or missing input file or item (exit 3), naming the file, the item and the fix; only an "
                       f"internal invariant stays a ValueError, added to ALLOWED_VALUE_ERRORS with its reason")
    stale = {k: (n, len(found.get(k, []))) for k, n in ALLOWED_VALUE_ERRORS.items() if len(found.get(k, [])) != n}
    assert not stale, f"ALLOWED_VALUE_ERRORS is out of date (allowed, found): {stale}"
