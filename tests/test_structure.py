"""The house: every package folder ships in the wheel, the imports between modules, the ones
inside functions included, form no cycle and flow one way (configs -> tasks, agents -> api ->
sim2real, viewer, evaluation -> commands -> cli), and only the command layer sets up the process."""

import ast
import os
import sys
import zipfile
from pathlib import Path

from conftest import ROOT, build_wheel

PACKAGE = ROOT / "legion"

# Which packages a package may import from (besides itself): the data flow of docs/architecture.md.
# The learning code sees only the VecEnv contract, never a task; the library (legion.api) builds
# what sim2real, the viewer, evaluation and the commands use; nothing below the command layer
# (legion.commands: one module per command) imports it, and the CLI only dispatches to it. The root
# package (the version, the process environment) is for everyone. The edge runtime
# (legion.sim2real.deploy: numpy only, what a robot installs) imports none of them: its file formats
# (the policy contract, the actuator network) are what training and the robot share, so the
# simulator may read them there.
LIBRARY = {"legion.configs", "legion.sim2real.deploy", "legion.tasks", "legion.agents", "legion.api"}
MAY_IMPORT = {
    "legion.configs": set(),
    "legion.sim2real.deploy": set(),
    "legion.tasks": {"legion.configs", "legion.sim2real.deploy"},
    "legion.agents": {"legion.configs"},
    "legion.api": {"legion.configs", "legion.tasks", "legion.agents"},
    "legion.viewer": LIBRARY,
    "legion.sim2real": LIBRARY,
    "legion.evaluation": LIBRARY,
    "legion.commands": LIBRARY | {"legion.sim2real", "legion.evaluation", "legion.viewer"},
    "legion.cli": {"legion.configs", "legion.commands"},
    "legion.__main__": {"legion.cli"},
    "legion": set(),
}
# Process-wide setup (threads, Warp's cache, the environment) is the command's to make, once, before
# it builds anything: a library function that made it would change the process of whoever calls it.
SETS_UP_THE_PROCESS = ("legion.api", "legion.commands", "legion.cli")


def package_files() -> list[Path]:
    """Every file of the package as the interpreter finds it: the links legion/tasks -> ../tasks,
    ... followed (``Path.rglob`` does not follow them before Python 3.13)."""
    return [Path(folder) / name for folder, subfolders, names in os.walk(PACKAGE, followlinks=True)
            if "__pycache__" not in Path(folder).parts for name in names]


def package_modules() -> dict[str, Path]:
    """Every module of the package, by name."""
    modules = {}
    for path in (p for p in package_files() if p.suffix == ".py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path], at_run_time: bool = False) -> set[str]:
    """The package modules ``name`` imports anywhere in its file: at the top, inside functions and,
    unless ``at_run_time``, under ``if TYPE_CHECKING:`` (annotations only: such an import never
    runs, so a module may name the type of what holds it, e.g. a manager its env, without a cycle).
    ``from a.b import c`` counts as a.b.c where that is a module."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for stmt in block.body for n in ast.walk(stmt)}
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if at_run_time and id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package this module is in
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def owner(module: str) -> str:
    """The entry of MAY_IMPORT a module belongs to (its longest matching prefix)."""
    return max((p for p in MAY_IMPORT if module == p or module.startswith(p + ".")), key=len)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two or more modules (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_every_package_folder_is_in_the_wheel(tmp_path):
    """A folder of modules without __init__.py (or a package the configured find misses) works in a
    checkout and would be silently absent from the wheel: build the wheel and compare."""
    shipped = set(zipfile.ZipFile(build_wheel(tmp_path)).namelist())
    on_disk = {str(p.relative_to(PACKAGE.parent)) for p in package_files()}
    assert "legion/tasks/env.py" in on_disk
    assert on_disk - shipped == set(), "in the checkout but not in the wheel (a folder without __init__.py?)"
    assert {"legion/py.typed", "legion/tasks/assets/quadruped.xml", "legion/configs/train.yaml",
            "legion/configs/task/arm_lift.yaml"} <= shipped
    assert not [f for f in shipped if f.split("/")[0] in ("tasks", "agents", "sim2real", "configs", "tests", "bench")]


def test_imports_form_no_cycle_and_flow_one_way():
    modules = package_modules()
    assert {"legion.tasks.env", "legion.agents.runner", "legion.sim2real.deploy.policy", "legion.configs.schema",
            "legion.api", "legion.commands", "legion.cli"} <= set(modules)
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert "legion.api" in graph["legion.sim2real.trajectories.record"]  # function-level imports are read

    wrong = sorted(f"{name} imports {target}" for name, targets in graph.items() for target in targets
                   if owner(target) not in (owner(name), "legion") and owner(target) not in MAY_IMPORT[owner(name)])
    assert not wrong, "imports against the data flow:\n" + "\n".join(wrong)

    found = cycles({name: imports_of(name, path, modules, at_run_time=True) for name, path in modules.items()})
    assert not found, "import cycles (function-level imports counted):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_import_scan_sees_a_cycle_and_a_wrong_way_import(tmp_path):
    """The scan itself: a cycle through a function-level import, and sim2real importing the CLI."""
    record = tmp_path / "record.py"
    record.write_text("def f():\n    from legion.commands import train\n")
    modules = {"legion.sim2real.trajectories.record": record,
               "legion.commands": ROOT / "legion" / "commands" / "__init__.py"}
    assert imports_of("legion.sim2real.trajectories.record", record, modules, at_run_time=True) == {"legion.commands"}
    record.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from legion.commands import train\n")
    assert imports_of("legion.sim2real.trajectories.record", record, modules) == {"legion.commands"}
    assert imports_of("legion.sim2real.trajectories.record", record, modules, at_run_time=True) == set()
    assert owner("legion.commands") not in MAY_IMPORT[owner("legion.sim2real.trajectories.record")]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_only_the_command_layer_sets_up_the_process():
    """setup_process (torch's threads, Warp's kernel cache) and set_process_env (MKL's reproducible
    mode, MuJoCo's OpenGL backend) are called by a command, or by legion.api's loading of a run,
    never by tasks, agents, sim2real, the viewer or evaluation."""
    calls = sorted(f"{name} calls {node.id if isinstance(node, ast.Name) else node.attr}"
                   for name, path in package_modules().items() if not name.startswith(SETS_UP_THE_PROCESS)
                   and name != "legion" for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, (ast.Name, ast.Attribute))
                   and (node.id if isinstance(node, ast.Name) else node.attr) in ("setup_process", "set_process_env"))
    assert not calls, "\n".join(calls)
