"""The package's shape: one import name, no import cycles, heavy dependencies behind their extras."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the folders and the package names they install as (pyproject.toml [tool.setuptools] package-dir)
FOLDERS = {"engine": "hardrank", "kernels": "hardrank.kernels", "jobs": "hardrank.jobs"}
HEAVY = ("ray", "nvidia.dali", "faiss", "matplotlib", "spacy", "nltk",  # optional or heavy: imported where needed
         "fsspec", "s3fs", "gcsfs", "adlfs", "webdataset", "moto", "boto3", "botocore", "transformers", "sentencepiece",
         "tokenizers", "tensorboard", "torch.utils.tensorboard", "wandb", "mlflow")


def _modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in FOLDERS.items():
        for p in sorted((ROOT / folder).rglob("*.py")):
            rel = p.relative_to(ROOT / folder).with_suffix("")
            parts = [x for x in rel.parts if x != "__init__"]
            out[".".join([pkg, *parts])] = p
    return out


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom | ast.Import, is_pkg: bool) -> list[str]:
    """Absolute names a statement imports (``from .x import y`` -> the module ``x`` or ``x.y``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        keep = len(parts) - node.level + (1 if is_pkg else 0)
        base = ".".join(parts[:keep] + ([node.module] if node.module else []))
    # `from pkg import sub` imports the submodule when there is one
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _imports(module: str) -> tuple[list[str], list[str]]:
    """(module-level imports, imports inside functions) of a hardrank module, as absolute names."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    top, inner = [], []
    is_pkg = path.name == "__init__.py"

    def walk(node, depth):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inner if depth else top).extend(_resolve(module, child, is_pkg))
            walk(child, depth + isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    for stmt in tree.body:  # `try: import tomllib / except: import tomli` at module level is still top level
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            top.extend(_resolve(module, stmt, is_pkg))
        else:
            walk(stmt, isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return top, inner


def _heavy(name: str) -> bool:
    return any(name == h or name.startswith(h + ".") for h in HEAVY)


def test_every_module_opens_with_its_purpose():
    for path in MODULES.values():
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and doc.strip(), f"{path.relative_to(ROOT)} has no module docstring (one line of purpose)"


def test_nothing_imports_the_folder_names():
    for name in MODULES:
        top, inner = _imports(name)
        bad = [m for m in top + inner if m.split(".")[0] in FOLDERS]
        assert not bad, f"{MODULES[name].relative_to(ROOT)} imports {bad}: import them as hardrank..."
    for test in sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(test.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert node.module.split(".")[0] not in FOLDERS, f"{test.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert all(a.name.split(".")[0] not in FOLDERS for a in node.names), test.name


# the front doors, which import what they name on first use, so that `import hardrank` and `hardrank --help`
# need no torch: the package's public API (``hardrank.__getattr__``), the command line's sub-commands
# (``jobs.cli``) and ``--version``'s package metadata (``jobs.commands``)
LAZY_FRONTS = {"hardrank": ("hardrank.",), "hardrank.jobs.cli": ("hardrank.jobs.",),
               "hardrank.jobs.commands": ("importlib.metadata",)}


def test_function_level_imports_only_for_heavy_optional_dependencies():
    """A function may import ray / DALI / faiss / matplotlib, or the one hardrank module that holds
    such an import at its top; everything else is imported at module top (but in the two front doors)."""
    holds_heavy = {m for m in MODULES if any(_heavy(x) for x in _imports(m)[0])}
    offenders = []
    for name in MODULES:
        for m in _imports(name)[1]:
            if name == "hardrank.openclip_import" and m.split(".")[0] == "open_clip":
                continue  # binds transformers into open_clip's module when a text tower needs it
            if name in LAZY_FRONTS and m.startswith(LAZY_FRONTS[name]):
                continue
            if not (_heavy(m) or m in holds_heavy or any(m.startswith(h + ".") for h in holds_heavy)):
                offenders.append(f"{MODULES[name].relative_to(ROOT)}: {m}")
    assert not offenders, "function-level imports of core modules:\n" + "\n".join(offenders)


# where each heavy dependency may be imported (module names, or a prefix ending in "_")
HOMES = {"ray": ("hardrank.executors.ray_",), "nvidia.dali": ("hardrank.encoding.dali",),
         "faiss": ("hardrank.scoring.faiss_index",),
         "matplotlib": ("hardrank.jobs.report.plots",),
         # fsspec only in hardrank.urls, inside its functions: local paths never import it; its backends
         # (s3fs, gcsfs, adlfs) are found by fsspec from the URL's protocol, never imported by name; the
         # webdataset package and moto (an S3 server) are test tools: shards are read and written with tarfile
         "fsspec": ("hardrank.urls",), "s3fs": (), "gcsfs": (), "adlfs": (), "webdataset": (), "moto": (),
         "boto3": (), "botocore": (),
         # transformers and sentencepiece (the hf extra) only inside functions of hardrank.models.hf_text (open_clip
         # builds the Hugging Face tokenizers and towers with them), hf_models (transformers models themselves) and
         # blip (BLIP); tokenizers builds the tests' stand-in tokenizers
         # (and hardrank.jobs.bench.inputs, which saves random BLIP folders for the benchmarks)
         # (and hardrank.openclip_import, which binds it into open_clip when a text tower needs it; and
         # hardrank.models.boundary, which asks it whether a class a folder's settings name is its own)
         "transformers": ("hardrank.models.hf_text", "hardrank.models.hf_models", "hardrank.models.blip",
                          "hardrank.jobs.bench.inputs", "hardrank.openclip_import", "hardrank.models.boundary"),
         "sentencepiece": ("hardrank.models.hf_text",), "tokenizers": (),
         # the training dashboards (--log-to): each imported inside hardrank.dashboards' functions, when asked for
         "tensorboard": ("hardrank.dashboards",), "torch.utils.tensorboard": ("hardrank.dashboards",),
         "wandb": ("hardrank.dashboards",), "mlflow": ("hardrank.dashboards",)}


def test_remote_backends_are_imported_only_inside_functions_of_their_home():
    """fsspec and its backends load only when a URL is given: not at `import hardrank`. transformers is
    imported by hardrank only where a model's text side needs it (open_clip imports it too, when installed)."""
    for name in MODULES:
        top, inner = _imports(name)
        assert not [m for m in top if _heavy(m) and m.split(".")[0] in ("fsspec", "s3fs", "gcsfs", "adlfs",
                                                                          "transformers", "sentencepiece")], name
        for m in inner:
            dep = m.split(".")[0]
            if dep in HOMES and dep not in ("ray", "faiss", "matplotlib"):
                assert name.startswith(HOMES[dep]) if HOMES[dep] else False, f"{name} imports {m}"


def test_heavy_dependencies_live_in_their_home_modules():
    for name in MODULES:
        for m in _imports(name)[0]:
            if _heavy(m):
                dep = next(h for h in HEAVY if m == h or m.startswith(h + "."))
                assert name.startswith(HOMES[dep]), f"{name} imports {dep}; only {HOMES[dep]} may (lazily elsewhere)"


def test_no_import_cycles():
    """No circle of hardrank modules, counting imports inside functions (a lazy import is still an arrow)."""
    graph = {m: sorted({x for x in _imports(m)[0] + _imports(m)[1] if x in MODULES and x != m}) for m in MODULES}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in graph[m]:
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)


def test_the_library_never_reaches_up_into_jobs():
    """jobs/ (the CLI) sits on top: no library or kernel module imports it, not even inside a function,
    and none loads a module by a name built at run time (importlib), which the graph could not see."""
    up = []
    for name in MODULES:
        if name.startswith("hardrank.jobs"):
            continue
        top, inner = _imports(name)
        up += [f"{name} -> {m}" for m in top + inner if m.startswith("hardrank.jobs")]
        if "importlib" in top + inner:
            up.append(f"{name} imports importlib")
    assert not up, "upward arrows:\n" + "\n".join(up)


def test_one_executor_factory_reads_the_executor_option():
    """The executor's name is compared in one place (``hardrank.executors``), not wherever work runs."""
    readers = []
    for name, path in MODULES.items():
        if name == "hardrank.executors" or name == "hardrank.config":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
            if any(isinstance(c, ast.Constant) and c.value in ("ray", "local") for c in operands):
                readers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not readers, readers


def test_core_imports_without_the_extras():
    """`import hardrank` and the CLI's parser work with ray, DALI, matplotlib and transformers absent."""
    script = ("import sys\n"
              "for m in ('ray', 'nvidia.dali', 'matplotlib', 's3fs', 'webdataset', 'moto', 'transformers',\n"
              "          'tensorboard', 'torch.utils.tensorboard', 'wandb', 'mlflow'):\n"
              "    sys.modules[m] = None\n"
              "import hardrank, hardrank.jobs.cli\n"
              "hardrank.jobs.cli.build_parser()\n"
              "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_missing_extra_names_the_install_command(tmp_path, monkeypatch, capsys):
    """Asking for Ray or DALI without them installed exits 1 with the pip command to run."""
    from helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config

    from hardrank.jobs.cli import main

    w = make_karpathy_world(tmp_path / "w", n_images=4)
    cfg = write_tiny_config(tmp_path)
    ckpt = save_random_checkpoint(cfg, tmp_path / "c.safetensors", 0)
    base = ["eval", "--model", str(cfg), "--checkpoint", str(ckpt), "--suite", "karpathy", "--annotations",
            str(w["annotations"]), "--images", str(w["images"]), "--store", str(tmp_path / "s"), "--quiet"]
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.delitem(sys.modules, "hardrank.executors.ray_embed", raising=False)
    assert main([*base, "--out", str(tmp_path / "o1"), "--executor", "ray"]) == 1
    assert "pip install 'hardrank[ray]'" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    monkeypatch.delitem(sys.modules, "hardrank.encoding.dali", raising=False)
    assert main([*base, "--out", str(tmp_path / "o2"), "--decoder", "dali"]) == 1
    assert "pip install 'hardrank[dali]'" in capsys.readouterr().err


@pytest.mark.slow
def test_wheel_installs_one_name(tmp_path):
    """`pip install .` puts only `hardrank` in site-packages: no `engine`, `kernels` or `jobs`."""
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = tmp_path.glob("hardrank-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"hardrank", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "hardrank/kernels/ranking.py" in names and "hardrank/jobs/cli.py" in names
    assert any(n.startswith("hardrank/assets/toy_checkpoints/") for n in names)
    assert "hardrank/embed/pipeline.py" in names and "hardrank/mining/run.py" in names
    # every module of the checkout, laid out as pyproject's package-dir maps it (a package missing from
    # pyproject's list is missing from the wheel, though an editable install still finds it)
    sources = {f"hardrank/{p.relative_to(ROOT / 'engine').as_posix()}" for p in (ROOT / "engine").rglob("*.py")}
    sources |= {f"hardrank/{d}/{p.relative_to(ROOT / d).as_posix()}" for d in ("kernels", "jobs")
                for p in (ROOT / d).rglob("*.py")}
    assert not sources - set(names), sorted(sources - set(names))


# What runs at import besides imports, definitions and plain assignments (issue 38: no process-wide effect at
# import but OpenMP's wait policy), each with its reason. Anything else is an explicit call of whoever needs it.
AT_IMPORT = {
    # must precede torch's loading of libgomp, which reads it once (docs/running.md "Busy machines")
    ("hardrank.openmp", "os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')"),
    # open_clip's first import (whenever it comes) leaves transformers out: a finder on sys.meta_path that
    # hides transformers from the thread importing open_clip, only while it does (start-up: 1.1-1.9 s)
    ("hardrank.openclip_import", "if 'open_clip' not in sys.modules and 'transformers' not in sys.modules:\n"
                                 "    sys.meta_path.insert(0, _OpenClipWithoutTransformers())"),
    # the lazy package: `hardrank.evaluate` stays the function once hardrank/evaluate.py is imported
    ("hardrank", "sys.modules[__name__].__class__ = _Package"),
    # a YAML loader subclass of our own that refuses repeated keys (the class's table, not yaml's)
    ("hardrank.suites.collections",
     "_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping)"),
}
# a registry's entries, made in its own package by its own register / alias calls (no other library's state):
# the search backends' built-ins, the suites' and the model kinds' one line each
REGISTRY_CALLS = {"hardrank.scoring.backends": {"register"}, "hardrank.suites": {"register", "alias"},
                  "hardrank.models": {"register_kind"}}


def _registry_line(module: str, stmt: ast.stmt) -> bool:
    calls = REGISTRY_CALLS.get(module, set())
    if isinstance(stmt, ast.For):
        return all(_registry_line(module, s) for s in stmt.body)
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name)
            and stmt.value.func.id in calls)
# calls that change process-wide state when a module-level assignment makes them (``x = os.environ.setdefault(...)``)
_EFFECTS = {"setdefault", "putenv", "set_num_threads", "set_num_interop_threads", "omp_set_num_threads",
            "basicConfig", "filterwarnings", "simplefilter", "signal", "setLevel", "addHandler", "manual_seed",
            "set_flush_denormal", "set_float32_matmul_precision", "on_use", "add_model_config"}


def _runs_at_import(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return False
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):  # a docstring
        return False
    if isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "__name__ == '__main__'":
        return False
    if isinstance(stmt, ast.Try):  # `try: import tomllib / except ...: import tomli as tomllib`
        return not all(isinstance(s, (ast.Import, ast.ImportFrom)) for b in (stmt.body, *[h.body for h in
                       stmt.handlers]) for s in b)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        if any(isinstance(t, (ast.Subscript, ast.Attribute)) for t in targets):  # os.environ["X"] = ..., mod.x = ...
            return True
        return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in _EFFECTS
                   for c in ast.walk(stmt))
    return True


def test_nothing_runs_at_import_but_the_listed_statements():
    """No module sets environment variables, thread pools, logging, warnings filters or other libraries'
    registries when it is imported (``hardrank.scoring.faiss_index`` used to register FAISS's thread setter
    with the budget module): whoever needs a setting makes it, explicitly, when the run starts."""
    found = set()
    for name, path in MODULES.items():
        for stmt in ast.parse(path.read_text()).body:
            if _runs_at_import(stmt) and not _registry_line(name, stmt):
                found.add((name, ast.unparse(stmt)))
    assert found == AT_IMPORT, (f"runs at import, unlisted: {sorted(found - AT_IMPORT)}; "
                                f"listed, gone: {sorted(AT_IMPORT - found)}")


def test_importing_every_module_changes_no_process_setting_but_the_wait_policy():
    """In a fresh interpreter, after the libraries hardrank imports (open_clip sets TOKENIZERS_PARALLELISM, Ray
    its warnings filters: theirs, not ours): every hardrank module imported (those whose optional extra is
    missing are skipped) leaves the environment (but ``OMP_WAIT_POLICY``), torch's and FAISS's threads,
    logging, warnings filters and signal handlers as they were."""
    external = sorted({m.split(".")[0] if m.split(".")[0] != "nvidia" else m for name in MODULES
                       for m in _imports(name)[0] if not m.startswith("hardrank")})
    script = textwrap.dedent(f"""
        import importlib, json, logging, os, signal, sys, warnings
        def load(names):
            skipped = []
            for name in names:
                try:
                    importlib.import_module(name)
                except ImportError:
                    skipped.append(name)
            return skipped
        load({external!r})
        import torch
        faiss = sys.modules.get("faiss")
        def state():
            return {{"env": {{k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}},
                    "torch": [torch.get_num_threads()], "faiss": faiss.omp_get_max_threads() if faiss else None,
                    "logging": [logging.root.level, len(logging.root.handlers)], "warnings": len(warnings.filters),
                    "signals": [str(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)]}}
        before = state()
        skipped = load({sorted(MODULES)!r})
        print(json.dumps({{"before": before, "after": state(), "skipped": skipped}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["after"] == got["before"]
    assert len(got["skipped"]) < len(MODULES) // 4, got["skipped"]


# The rooms (engine's top-level packages and modules, kernels, jobs) bottom to top, as README "Layout" draws
# them: a room may import only rooms below it (function-level imports included), so no circle can form.
# A new room takes its place here (and in README); a new arrow up means a shared piece belongs lower:
# move it into the lowest room that every user can import (formats/ holds the file formats several rooms read).
LAYERS = [
    "units", "errors", "text", "word_tags", "tasks", "openmp", "urls", "vectors", "atomic", "items", "options",
    "openclip_import", "cpus", "devices", "settings", "suite_registry", "kernels",
    "formats",
    "scoring", "config", "models", "store", "inputs", "encoding", "executors", "embed", "mining", "perturb",
    "toyworld", "suites", "subsets", "dashboards", "compare", "evaluate", "attack_run", "exports",
    "jobs",
]


def _room(module: str) -> str:
    """``hardrank.scoring.rank`` -> ``scoring``; ``hardrank.jobs.cli`` -> ``jobs``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "hardrank"


def _up_arrows() -> set[tuple[str, str]]:
    rank = {r: i for i, r in enumerate(LAYERS)}
    rooms = {_room(m) for m in MODULES if m != "hardrank"}
    unplaced = sorted(rooms - set(rank))
    assert not unplaced, f"rooms {unplaced} are not in tests/test_layout.py LAYERS: place each (and in README Layout)"
    up = set()
    for name, path in MODULES.items():
        if name == "hardrank":  # the front door: its public names load on first use
            continue
        top, inner = _imports(name)
        for m in top + inner:
            if m in MODULES and m != "hardrank" and rank[_room(m)] > rank[_room(name)]:
                up.add((str(path.relative_to(ROOT)), m))
    return up


def test_every_import_points_down_the_layers():
    """Rooms in the written order (LAYERS, README "Layout"): every import, function-level ones included, goes to
    a room below."""
    up = sorted(_up_arrows())
    assert not up, "imports pointing up the layers (tests/test_layout.py LAYERS):\n" + "\n".join(
        f"{f} imports {m} (room {_room(m)!r} sits above)  fix: move what it needs into the lowest room both can "
        f"import, or move the importer up" for f, m in up)


def test_no_circle_between_rooms():
    """No circle of rooms (a room's modules count as one node), function-level imports included."""
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        if name == "hardrank":
            continue
        top, inner = _imports(name)
        graph.setdefault(_room(name), set()).update(
            _room(m) for m in top + inner if m in MODULES and m != "hardrank" and _room(m) != _room(name))
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(r):
        state[r] = 1
        stack.append(r)
        for n in sorted(graph.get(r, ())):
            if state.get(n) == 1:
                raise AssertionError("rooms in a circle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[r] = 2

    for r in sorted(graph):
        if r not in state:
            visit(r)


def test_readme_layout_draws_the_layers_in_order():
    """README "Layout" lists the rooms top to bottom: the reverse of LAYERS, every room once."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    drawn = []
    for line in block.splitlines():
        if not line.strip() or line[0].isspace():
            continue  # a description's continuation
        left = line.split("  ", 1)[0]
        drawn += [t.removesuffix("/").removesuffix(".py") for t in left.split()]
    drawn = [r for r in drawn if r != "assets"]  # package data, no code
    assert drawn[::-1] == LAYERS, (f"README Layout draws (bottom to top) {drawn[::-1]}; tests/test_layout.py "
                                   f"LAYERS is {LAYERS}: draw the rooms in LAYERS' order")
