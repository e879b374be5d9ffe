"""The package namespace: everything imports as infclip.*, nothing under a generic top-level name."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_import_infclip_gives_the_api_and_no_generic_top_level_modules():
    """A fresh interpreter imports the whole project (library, launchers' modules, the op) and
    ends with no ``ops``, ``pipeline`` or ``eval`` module of its own: a stray ``from ops import``
    would load a second copy of the op under another name (and register it twice)."""
    code = (
        "import sys, runpy\n"
        "import infclip, infclip.pipeline.train.train, infclip.eval, infclip.pipeline.data.scenes\n"
        "from infclip import contrastive_loss, ContrastiveLoss, CLIPTowers, load_config, train, export_hf\n"
        "assert contrastive_loss.__module__ == 'infclip.ops.contrastive_loss', contrastive_loss.__module__\n"
        "assert CLIPTowers.__module__ == 'infclip.pipeline.model.model'\n"
        "for launcher in ('pretrain', 'zeroshot', 'make_shards', 'openclip_tokenizer'):\n"
        "    runpy.run_path(f'launch/{launcher}.py', run_name='not_main')\n"
        "generic = sorted(m for m in sys.modules if m.split('.')[0] in ('ops', 'pipeline', 'eval'))\n"
        "assert not generic, generic\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH="")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


LAYERS = ("ops", "pipeline", "eval", "launch")  # each imports only from its own layer and those before
# inside pipeline/, the same rule: errors.py, data/, model/, config.py (the run's file, over the model and
# data sections), engine/, train/
PIPELINE_LAYERS = ("errors", "data", "model", "config", "engine", "train")


def _project_imports() -> dict:
    """{module: the project modules it imports} for every .py file of the four layers, read from the
    source (imports inside functions included): ``ops.sweeps``-style names, ``infclip.`` dropped,
    ``from . import x`` as the module x."""
    import ast

    modules = {}
    for layer in LAYERS:
        for folder, _dirs, files in os.walk(os.path.join(ROOT, layer)):
            for name in files:
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                    modules[rel.removesuffix(".__init__")] = os.path.join(folder, name)

    def known(name: str):
        name = name.removeprefix("infclip.")
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        found = set()
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(known(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # from . / from .. : up level - 1 packages from this one
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else [])
                    base = ".".join(parts)
                # each name a module of its own, else (a name defined in ``base``) base's module
                found.update(known(f"{base}.{a.name}") or known(base) for a in node.names)
        graph[module] = found - {None, module}
    return graph


def test_imports_point_one_way_and_never_in_a_circle():
    """launch -> eval -> pipeline -> ops, and inside pipeline train -> engine -> config -> model ->
    data -> errors: no module imports from a later layer, and no chain of imports, lazy ones inside
    functions included, leads back to where it started (a circle forces an import inside a function
    and an order of first use)."""
    graph = _project_imports()
    assert len(graph) > 40 and graph["ops.assembly"], "the import graph was not read"
    upward = sorted((m, t) for m, ts in graph.items() for t in ts
                    if LAYERS.index(t.split(".")[0]) > LAYERS.index(m.split(".")[0]))
    assert not upward, f"imports against the layers: {upward}"
    inside = {m: m.split(".")[1] for m in graph if m.startswith("pipeline.")}
    assert set(inside.values()) == set(PIPELINE_LAYERS), sorted(set(inside.values()))
    upward = sorted((m, t) for m, ts in graph.items() if m in inside for t in ts if t in inside
                    and PIPELINE_LAYERS.index(inside[t]) > PIPELINE_LAYERS.index(inside[m]))
    assert not upward, f"imports against pipeline's layers: {upward}"
    done, path = set(), []

    def visit(module):
        if module in path:
            raise AssertionError(f"an import circle: {' -> '.join(path[path.index(module):] + [module])}")
        if module in done:
            return
        path.append(module)
        for target in sorted(graph[module]):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)


def test_ops_knobs_are_set_through_the_tuning_object_only():
    """Outside ops/ nothing assigns or monkeypatches an UPPER_CASE name of an ops module: the op's
    knobs are the fields of one typed object (ops/tuning.py: ``with tuning(...)``, or a field of
    TUNING), so that every setting is documented in one place and a module constant is never
    changed behind the code that read it."""
    import ast
    import re

    ops_modules = {name[:-3] for name in os.listdir(os.path.join(ROOT, "ops")) if name.endswith(".py")}
    knob = re.compile(r"_?[A-Z][A-Z0-9_]*$")
    found = []
    for folder in ("bench", "tests", "pipeline", "eval", "launch"):
        for path, _dirs, files in os.walk(os.path.join(ROOT, folder)):
            for name in (f for f in files if f.endswith(".py")):
                file = os.path.join(path, name)
                with open(file) as f:
                    tree = ast.parse(f.read())
                aliases = set()  # names bound to an ops module in this file
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        aliases.update(a.asname for a in node.names
                                       if a.asname and a.name.startswith("infclip.ops."))
                    elif isinstance(node, ast.ImportFrom) and node.module == "infclip.ops":
                        aliases.update(a.asname or a.name for a in node.names if a.name in ops_modules)

                def ops_module(expr) -> bool:
                    if isinstance(expr, ast.Name):
                        return expr.id in aliases
                    return (isinstance(expr, ast.Call) and getattr(expr.func, "attr", "") == "import_module"
                            and bool(expr.args) and isinstance(expr.args[0], ast.Constant)
                            and str(expr.args[0].value).startswith("infclip.ops"))

                for node in ast.walk(tree):
                    targets = []
                    if isinstance(node, (ast.Assign, ast.AugAssign)):
                        for t in getattr(node, "targets", None) or [node.target]:
                            targets += t.elts if isinstance(t, ast.Tuple) else [t]
                        hits = [t.attr for t in targets if isinstance(t, ast.Attribute)
                                and ops_module(t.value) and knob.match(t.attr)]
                    elif (isinstance(node, ast.Call) and len(node.args) >= 2
                          and getattr(node.func, "attr", getattr(node.func, "id", "")) == "setattr"
                          and ops_module(node.args[0]) and isinstance(node.args[1], ast.Constant)
                          and knob.match(str(node.args[1].value))):
                        hits = [node.args[1].value]
                    else:
                        continue
                    found += [f"{os.path.relpath(file, ROOT)}:{node.lineno} {h}" for h in hits]
    assert not found, f"ops module constants set from outside ops/ (use ops.tuning): {found}"
