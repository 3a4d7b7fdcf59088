"""The import rules of ARCHITECTURE.md, checked on the source and on a real plugin scan."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "pytorch_lightning", "mlflow", "optuna", "matplotlib", "ray")
HYDRA = ("hydra", "omegaconf")
# Modules at the package's top, shared by every layer.
SHARED = (
    "furcate_hydra.addresses",
    "furcate_hydra.errors",
    "furcate_hydra.atomic",
    "furcate_hydra.layout",
    "furcate_hydra.progress",
    "furcate_hydra.known_warnings",
    "furcate_hydra.reasons",
    "furcate_hydra.sqlite_health",
    "furcate_hydra.sqlite_lock",
    "furcate_hydra.preemption",
    "furcate_hydra.quick_exit",
    "furcate_hydra.job_secrets",
    "furcate_hydra.said_once",
    "furcate_hydra.python_dirs",
    "furcate_hydra.new_process",
)
ENV_VARS = "furcate_hydra.env_vars"
# The execution layer sets variables in a job's environment (a slot's GPU count) by their
# names there: what may load it may load them.
EXECUTION = ("furcate_hydra.execution", ENV_VARS)


# The Hydra-facing folders: the rest of the package never imports Hydra, so the core (what
# runs when, where and how jobs run, the store, the traces) is testable without it.
HYDRA_FACING = (
    "furcate_hydra.hydra_api",
    "furcate_hydra.launching",
    "furcate_hydra.slurm.submit_sweep",
    "furcate_hydra.sweepers",
    "furcate_hydra.records",
    "furcate_hydra.job_process",
)
# Slurm's one Hydra-facing module: ``backend=slurm`` on the login node reads the sweep's config.
SLURM_SUBMIT = "furcate_hydra/slurm/submit_sweep.py"
# What the launcher's options load: they are checked wherever a sweep's config is read.
LAUNCHER_OPTIONS = (
    "furcate_hydra.launching.launcher_options",
    ENV_VARS,
    "furcate_hydra.execution",
    "furcate_hydra.hydra_api",
    "furcate_hydra.job_process.lightning_auto",
    "furcate_hydra.monitor",
    "furcate_hydra.ray_backend.options",
    "furcate_hydra.slurm",  # its package loads the Slurm core
    "furcate_hydra.store",
)
LIGHTNING_AUTO = "furcate_hydra/job_process/lightning_auto.py"
CORE = (
    "furcate_hydra.execution",
    "furcate_hydra.monitor",
    "furcate_hydra.store",
    "furcate_hydra.sweeping",
    "furcate_hydra.tuning",
    "furcate_hydra.tracing",
    "furcate_hydra.ray_backend",
    "furcate_hydra.slurm",
    "furcate_hydra.scheduling",
)


@dataclass(frozen=True)
class Rule:
    """What the modules under ``folder`` (a folder or one module) may import of the project,
    and may not import at all; ``exempt`` modules have a rule of their own."""

    folder: str
    project: tuple[str, ...]  # allowed prefixes of furcate_hydra / hydra_plugins modules
    forbidden: tuple[str, ...]  # third-party top-level packages
    exempt: tuple[str, ...] = ()


RULES = (
    Rule("furcate_hydra/execution", (*SHARED, *EXECUTION), (*HYDRA, *HEAVY)),
    # the Ray backend: the one place that imports Ray (inside functions), beside the execution
    Rule(
        "furcate_hydra/ray_backend",
        (*SHARED, *EXECUTION, "furcate_hydra.ray_backend"),
        (*HYDRA, *(name for name in HEAVY if name != "ray")),
    ),
    # Slurm: the job a launcher runs in, its requeue, a session's tags in it, sbatch from a
    # login node (as commands)
    Rule(
        "furcate_hydra/slurm",
        (*SHARED, "furcate_hydra.slurm", "furcate_hydra.store"),
        (*HYDRA, *HEAVY),
        exempt=(SLURM_SUBMIT,),
    ),
    # backend=slurm from the login node: the sweep's config read, then the Slurm core
    Rule(
        SLURM_SUBMIT,
        (*SHARED, *LAUNCHER_OPTIONS, "furcate_hydra.slurm"),
        HEAVY,
    ),
    Rule("furcate_hydra/sweeping", (*SHARED, "furcate_hydra.sweeping"), (*HYDRA, *HEAVY)),
    Rule(
        "furcate_hydra/monitor",
        (*SHARED, *EXECUTION, "furcate_hydra.monitor"),
        (*HYDRA, *HEAVY),
    ),
    Rule("furcate_hydra/store", (*SHARED, "furcate_hydra.store"), (*HYDRA, "torch", "optuna")),
    # what runs when: testable without Hydra, over the executor and the store's decisions
    Rule(
        "furcate_hydra/scheduling",
        (*SHARED, *EXECUTION, "furcate_hydra.store", "furcate_hydra.scheduling"),
        (*HYDRA, *HEAVY),
    ),
    # the launcher's resource trace: psutil, NVML and (to draw it) matplotlib, no store
    Rule(
        "furcate_hydra/tracing",
        (*SHARED, *EXECUTION, "furcate_hydra.tracing"),
        (*HYDRA, "torch", "pytorch_lightning", "mlflow", "optuna"),
    ),
    Rule("furcate_hydra/tuning", (*SHARED, ENV_VARS, "furcate_hydra.tuning"), (*HYDRA, "torch")),
    Rule(
        "furcate_hydra/lightning",
        (
            *SHARED,
            ENV_VARS,
            "furcate_hydra.lightning",
            "furcate_hydra.tuning",
            "furcate_hydra.fusion",
        ),
        HYDRA,
    ),
    # fused trials' training: torch in the job's process, nothing of the launcher's side
    Rule(
        "furcate_hydra/fusion",
        (*SHARED, ENV_VARS, "furcate_hydra.fusion"),
        (*HYDRA, "mlflow", "optuna", "ray", "pytorch_lightning"),
    ),
    # the furcate command: reads stores and sweep dirs, where the sweep's code need not run
    Rule(
        "furcate_hydra/cli",
        (*SHARED, "furcate_hydra.store", "furcate_hydra.cli"),
        (*HYDRA, "torch", "pytorch_lightning", "optuna"),
    ),
    # Hydra's API as furcate reads it: below every Hydra-facing folder
    Rule("furcate_hydra/hydra_api", (*SHARED, "furcate_hydra.hydra_api"), HEAVY),
    # the launcher's side: every core folder, the record policy; never the job's library
    Rule(
        "furcate_hydra/launching",
        (*SHARED, ENV_VARS, *CORE, *HYDRA_FACING),
        ("torch", "pytorch_lightning", "ray"),
    ),
    # the record policy: the store, the execution's Job, Hydra's JobReturn
    Rule(
        "furcate_hydra/records",
        (
            *SHARED,
            ENV_VARS,
            "furcate_hydra.execution",
            "furcate_hydra.store",
            "furcate_hydra.tracing",
            "furcate_hydra.hydra_api",
            "furcate_hydra.records",
            "furcate_hydra.job_process",
            *LAUNCHER_OPTIONS,
            "furcate_hydra.launching.job_dirs",
            "furcate_hydra.launching.streaming",
        ),
        ("torch", "pytorch_lightning", "ray"),
    ),
    # what furcate's sweepers share: the launcher's streaming contract and composition
    Rule(
        "furcate_hydra/sweepers",
        (
            *SHARED,
            ENV_VARS,
            "furcate_hydra.hydra_api",
            "furcate_hydra.sweepers",
            "furcate_hydra.sweeping",
            "furcate_hydra.store",
            "furcate_hydra.tuning",
            "furcate_hydra.launching",
            "furcate_hydra.ray_backend.options",
        ),
        ("torch", "pytorch_lightning", "ray"),
    ),
    # the job's process: Hydra's run_job, the ranks' command line, lightning=auto
    Rule(
        "furcate_hydra/job_process",
        (
            *SHARED,
            ENV_VARS,
            "furcate_hydra.hydra_api",
            "furcate_hydra.job_process",
            "furcate_hydra.store",
            "furcate_hydra.lightning",
        ),
        ("torch", "pytorch_lightning", "ray"),
        exempt=(LIGHTNING_AUTO,),
    ),
    # hydra.launcher.lightning=auto: light for the launcher's side; the Lightning layer only
    # inside functions, once the job imported Lightning (test below)
    Rule(
        LIGHTNING_AUTO,
        (*SHARED, ENV_VARS, "furcate_hydra.job_process.lightning_auto", "furcate_hydra.lightning"),
        (*HYDRA, *HEAVY),
    ),
)
PLUGINS = ("furcate_launcher", "furcate_sweeper", "furcate_optuna_sweeper")
# what a plugin may import of the project, beside its own package
PLUGIN_MAY = (
    *SHARED,
    ENV_VARS,
    "furcate_hydra.hydra_api",
    "furcate_hydra.launching",
    "furcate_hydra.slurm.submit_sweep",
    "furcate_hydra.sweepers",
    "furcate_hydra.records",
    "furcate_hydra.store",
    "furcate_hydra.sweeping",
    "furcate_hydra.tuning",
)


def imports(path: Path) -> Iterator[str]:
    """Every absolute import of a module, at its top or inside functions."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            if node.module == "furcate_hydra":  # from furcate_hydra import env_vars
                yield from (f"furcate_hydra.{alias.name}" for alias in node.names)


def project(name: str) -> bool:
    return name.split(".")[0] in ("furcate_hydra", "hydra_plugins")


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    """``name`` is under an allowed prefix, or a package above one (importing ``a.b.c`` runs
    ``a.b``'s ``__init__``, whose own imports are checked as its own loads)."""
    return any(name == p or name.startswith(p + ".") or p.startswith(name + ".") for p in prefixes)


def sources(folder: str, exempt: tuple[str, ...] = ()) -> list[Path]:
    """The modules a rule covers: a folder's (less those with a rule of their own), or one."""
    where = REPO / folder
    paths = [where] if where.suffix == ".py" else sorted(where.rglob("*.py"))
    return [path for path in paths if str(path.relative_to(REPO)) not in exempt]


def violations(
    folder: str,
    allowed: tuple[str, ...],
    forbidden: tuple[str, ...],
    exempt: tuple[str, ...] = (),
) -> list[str]:
    found = []
    for path in sources(folder, exempt):
        for name in imports(path):
            where = path.relative_to(REPO)
            if (project(name) and not within(name, allowed)) or name.split(".")[0] in forbidden:
                found.append(f"{where} imports {name}")
    return found


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.folder)
def test_each_layer_imports_only_what_it_may(rule: Rule) -> None:
    assert violations(rule.folder, rule.project, rule.forbidden, rule.exempt) == []


# -- through other modules: what importing a module loads ----------------------------------
#
# An import inside a function is a door its module opens when it needs it (Ray, the Lightning
# layer, a plugin's core): the rule of the module that holds it checks it, above. What a
# module imports when it is itself imported (at its top, not under TYPE_CHECKING) comes with
# it wherever it is used, so a layer must be allowed all of that, module after module.


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _loaded(body: list[ast.stmt]) -> Iterator[str]:
    """The absolute imports that run when a module (or a class body) runs."""
    for node in body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.If):
            yield from _loaded(node.orelse if _type_checking(node) else node.body + node.orelse)
        elif isinstance(node, ast.Try):
            handlers = [stmt for handler in node.handlers for stmt in handler.body]
            yield from _loaded(node.body + handlers + node.orelse + node.finalbody)
        elif isinstance(node, ast.With | ast.ClassDef):
            yield from _loaded(node.body)


def project_modules() -> dict[str, Path]:
    found = {}
    for root in ("furcate_hydra", "hydra_plugins"):
        for path in (REPO / root).rglob("*.py"):
            found[module_name(path)] = path
    return found


def load_graph() -> dict[str, set[str]]:
    """Each project module and the project modules importing it loads (with their packages:
    importing ``a.b.c`` runs ``a`` and ``a.b``)."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        loaded = set()
        for imported in _loaded(ast.parse(path.read_text(), str(path)).body):
            parts = imported.split(".")
            loaded |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & modules.keys()
        graph[name] = loaded - {name}
    return graph


def reached(graph: dict[str, set[str]], start: str, allowed: tuple[str, ...]) -> list[str]:
    """The first chain of loads from ``start`` to a project module outside ``allowed``, or
    an empty list (breadth first: the shortest such chain)."""
    came_from: dict[str, str | None] = {start: None}
    queue = [start]
    for module in queue:
        if module != start and not within(module, allowed):
            chain = [module]
            while (before := came_from[chain[-1]]) is not None:
                chain.append(before)
            return chain[::-1]
        for imported in sorted(graph[module] - came_from.keys()):
            came_from[imported] = module
            queue.append(imported)
    return []


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def transitive_violations(
    folder: str, allowed: tuple[str, ...], exempt: tuple[str, ...] = ()
) -> list[str]:
    graph = load_graph()
    found = []
    for module in sorted(module_name(path) for path in sources(folder, exempt)):
        chain = reached(graph, module, allowed)
        if chain:
            found.append(" loads ".join(chain))
    return found


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.folder)
def test_no_layer_reaches_what_it_may_not_import_through_another(rule: Rule) -> None:
    assert transitive_violations(rule.folder, rule.project, rule.exempt) == []


def test_the_transitive_check_finds_a_chain_of_loads() -> None:
    graph = {"a.x": {"b.y"}, "b.y": {"c.z"}, "c.z": set()}
    assert reached(graph, "a.x", ("a", "b")) == ["a.x", "b.y", "c.z"]
    assert reached(graph, "a.x", ("a", "b", "c")) == []
    # what the sweeper reached before it had its own door to the Ray backend's store checks
    real = load_graph()
    assert "furcate_hydra.execution.local_pool" in real["furcate_hydra.launching.backends"]
    chain = reached(real, "furcate_hydra.launching.backends", PLUGIN_MAY)
    assert chain[0] == "furcate_hydra.launching.backends"
    assert chain[-1].startswith(("furcate_hydra.execution", "furcate_hydra.ray_backend"))


def test_lightning_auto_imports_the_lightning_layer_only_inside_functions() -> None:
    top_level = []
    for path in sources(LIGHTNING_AUTO):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "furcate_hydra.lightning."
            ):
                top_level.append(f"{path.name} imports {node.module}")
    assert top_level == []
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, furcate_hydra.job_process.lightning_auto as a; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in "
         f"{(*HEAVY, 'lightning')!r} or m.startswith('furcate_hydra.lightning.')))"],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout.strip()  # fmt: skip
    assert loaded == "[]"


def test_only_the_nvml_door_imports_pynvml() -> None:
    # one place owns NVML's import, its start and stop, and its errors (execution/gpu/nvml.py)
    found = [
        str(path.relative_to(REPO))
        for root in ("furcate_hydra", "hydra_plugins")
        for path in sorted((REPO / root).rglob("*.py"))
        if any(name.split(".")[0] == "pynvml" for name in imports(path))
    ]
    assert found == ["furcate_hydra/execution/gpu/nvml.py"]


def test_the_shared_modules_import_no_layer_and_no_hydra() -> None:
    found = []
    for path in sorted((REPO / "furcate_hydra").glob("*.py")):
        for name in imports(path):
            if (project(name) and not within(name, SHARED)) or name.split(".")[0] in (
                *HYDRA,
                *HEAVY,
            ):
                found.append(f"{path.name} imports {name}")
    assert found == []


@pytest.mark.parametrize("plugin", PLUGINS)
def test_a_plugin_uses_the_shared_folders_not_another_plugin_nor_the_executor(plugin: str) -> None:
    allowed = (*PLUGIN_MAY, f"hydra_plugins.{plugin}")
    assert violations(f"hydra_plugins/{plugin}", allowed, ("torch", "pytorch_lightning")) == []
    # nor through the hydra layer: a sweeper runs with any launcher, and the launcher plugin
    # reaches the executor only inside launch(), through the launch session
    assert transitive_violations(f"hydra_plugins/{plugin}", allowed) == []


@pytest.mark.parametrize("plugin", PLUGINS)
def test_a_plugins_config_imports_only_hydras_config_store(plugin: str) -> None:
    config = REPO / "hydra_plugins" / plugin / "config.py"
    allowed = {"dataclasses", "typing", "hydra.core.config_store", "omegaconf"}
    assert set(imports(config)) <= allowed


def test_hydra_has_no_plugin_namespace_init() -> None:
    # hydra_plugins is a namespace package shared with every other Hydra plugin installed
    assert not (REPO / "hydra_plugins" / "__init__.py").exists()


def test_hydras_plugin_scan_loads_no_heavy_library() -> None:
    """Hydra imports every plugin module at every app start: they must stay cheap."""
    code = (
        "import sys\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.plugins.launcher import Launcher\n"
        "from hydra.plugins.sweeper import Sweeper\n"
        "found = [Plugins.instance().discover(t) for t in (Launcher, Sweeper)]\n"
        "names = {c.__name__ for kind in found for c in kind}\n"
        "print(sorted(n for n in names if n.startswith('Furcate')))\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    found, heavy = done.stdout.splitlines()[-2:]
    assert found == "['FurcateLauncher', 'FurcateOptunaSweeper', 'FurcateSweeper']"
    assert heavy == "[]"


def test_no_module_is_over_400_lines() -> None:
    # a module past this has two jobs in it: split it where they part
    long = {}
    for root in ("furcate_hydra", "hydra_plugins"):
        for path in (REPO / root).rglob("*.py"):
            if (lines := len(path.read_text().splitlines())) > 400:
                long[str(path.relative_to(REPO))] = lines
    assert long == {}


def import_graph() -> dict[str, set[str]]:
    """Each project module and the project modules it names in any import: at its top, inside
    functions, or for type checking only (a circle of types is still a circle to read)."""
    modules = project_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        named = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    named.add(full if full in modules else node.module)
            elif isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
        graph[name] = (named & modules.keys()) - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a loop (Tarjan's
    strongly connected components, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = stack[stack.index(node) :]
                    del stack[stack.index(node) :]
                    if len(group) > 1:
                        found.append(sorted(group))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                work.append((step, iter(sorted(graph[step]))))
            elif step in stack:
                low[node] = min(low[node], index[step])
    return found


def test_no_modules_import_each_other() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles(import_graph()) == []
