"""The options reference, generated from the plugins' config dataclasses at every docs build.

mkdocs runs this module as a hook (``hooks:`` in mkdocs.yml). In ``docs/reference/options.md``
a line ``<!-- options: hydra.launcher -->`` becomes the tables of every option under that key:

    hydra_plugins/*/config.py ──import──► Hydra's ConfigStore (group, name, dataclass)
                              ──ast─────► the comment above each field
        ─► one table per dataclass: option, type, default (from the dataclass), meaning
           (its comment); nested dataclasses (hydra.launcher.mlflow) and group options
           (hydra/sweeper/sampler=tpe) get tables of their own

A plugin option without a comment stops the build (``OptionDocError``), and so does a
``<!-- details: KEY -->`` table that names an option no dataclass has: the reference cannot
drift from the code. Sampler and pruner options are Optuna's constructor arguments: they are
listed with their defaults, and their comment where the source has one.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PLUGIN_GROUPS = ("hydra/launcher", "hydra/sweeper")
# groups whose options pass Optuna's constructor arguments through: a comment is optional
PASSTHROUGH_GROUPS = ("hydra/sweeper/sampler", "hydra/sweeper/pruner")
OPTIONS_MARKER = re.compile(r"^<!-- options: (?P<key>[\w./=]+) -->$", re.MULTILINE)
DETAILS_MARKER = re.compile(r"^<!-- details: (?P<key>[\w./=]+) -->$")
OPTIONS_PAGE = "reference/options.md"


class OptionDocError(Exception):
    """An option the reference cannot document: no comment, or a name no dataclass has."""


@dataclass(frozen=True)
class ConfigEntry:
    """One dataclass as users reach it: its key prefix and how they pick it."""

    prefix: str  # hydra.launcher, hydra.launcher.mlflow, hydra.sweeper.sampler
    choice: str  # hydra/launcher=furcate, or "" for a nested dataclass
    owner: str  # the choice of the plugin it belongs to (its own, or its parent's)
    cls: type[Any]
    comments_required: bool


@dataclass(frozen=True)
class OptionRow:
    """One row of a generated table."""

    key: str
    type: str
    default: str
    meaning: str


def config_modules() -> list[ModuleType]:
    """Import every plugin's config module, which registers its dataclasses with Hydra."""
    names = sorted(p.parent.name for p in (REPO / "hydra_plugins").glob("*/config.py"))
    return [importlib.import_module(f"hydra_plugins.{name}.config") for name in names]


def module_dataclasses(module: ModuleType) -> list[type[Any]]:
    """The dataclasses a config module defines (not the ones it imports)."""
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and dataclasses.is_dataclass(obj)
        and obj.__module__ == module.__name__
    ]


def field_comments(cls: type[Any]) -> dict[str, str]:
    """Each field's comment: the ``#`` lines right above it in the class body, joined."""
    source_file = Path(typing.cast(str, importlib.import_module(cls.__module__).__file__))
    lines = source_file.read_text().splitlines()
    tree = ast.parse("\n".join(lines), str(source_file))
    comments: dict[str, str] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == cls.__name__):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                above: list[str] = []
                index = stmt.lineno - 2
                while index >= 0 and lines[index].strip().startswith("#"):
                    above.insert(0, lines[index].strip().lstrip("#").strip())
                    index -= 1
                if above:
                    comments[stmt.target.id] = " ".join(above)
    return comments


def _registered() -> Iterator[tuple[str, str, type[Any]]]:
    """(group, name, dataclass) of every config node furcate registers with Hydra."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    def walk(tree: dict[str, Any], group: str) -> Iterator[tuple[str, str, type[Any]]]:
        for name, item in sorted(tree.items()):
            if isinstance(item, dict):
                yield from walk(item, f"{group}/{name}" if group else name)
            elif (item.provider or "").startswith("furcate"):
                cls = OmegaConf.get_type(item.node)
                if isinstance(cls, type) and dataclasses.is_dataclass(cls):
                    yield group, name.removesuffix(".yaml"), cls

    yield from walk(ConfigStore.instance().repo, "")


def config_entries() -> list[ConfigEntry]:
    """Every dataclass users set options of, with the key its options sit under."""
    config_modules()
    entries: list[ConfigEntry] = []
    for group, name, cls in _registered():
        if group in PLUGIN_GROUPS:
            prefix = group.replace("/", ".")
            choice = f"{group}={name}"
            entries.append(ConfigEntry(prefix, choice, choice, cls, True))
            entries.extend(_nested(prefix, choice, cls))
        elif group in PASSTHROUGH_GROUPS:
            choice = f"{group}={name}"
            entries.append(ConfigEntry(group.replace("/", "."), choice, choice, cls, False))
    return entries


def _nested(prefix: str, owner: str, cls: type[Any]) -> Iterator[ConfigEntry]:
    for f in dataclasses.fields(cls):
        made = f.default_factory
        if isinstance(made, type) and dataclasses.is_dataclass(made):
            key = f"{prefix}.{f.name}"
            yield ConfigEntry(key, "", owner, made, True)
            yield from _nested(key, owner, made)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return f"{_type_name(inner[0])} or null"
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if annotation is Any:
        return "any"
    if dataclasses.is_dataclass(annotation):
        return "options"
    return getattr(annotation, "__name__", str(annotation))


def _value(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "???":
        return "(the group's default)"
    return f"`{value!r}`" if isinstance(value, str) and value == "" else f"`{value}`"


def _default(f: dataclasses.Field[Any], group_defaults: dict[str, str]) -> str:
    if f.name in group_defaults:
        return f"`{group_defaults[f.name]}`"
    if f.default is not dataclasses.MISSING:
        return _value(f.default)
    if f.default_factory is not dataclasses.MISSING:
        made = f.default_factory()
        if dataclasses.is_dataclass(made):
            return f"see `{f.name}.*`"
        return _value(made)
    return "(required)"


def _group_defaults(cls: type[Any]) -> dict[str, str]:
    """A sweeper's `defaults` list: {field: the choice it defaults to}."""
    for f in dataclasses.fields(cls):
        if f.name == "defaults" and f.default_factory is not dataclasses.MISSING:
            made = f.default_factory()
            return {k: str(v) for item in made if isinstance(item, dict) for k, v in item.items()}
    return {}


def _group_choices(group: str) -> list[str]:
    return [name for g, name, _cls in _registered() if g == group]


def rows(entry: ConfigEntry) -> list[OptionRow]:
    """The table rows of one dataclass; raises OptionDocError for an undocumented option."""
    comments = field_comments(entry.cls)
    hints = typing.get_type_hints(entry.cls)
    defaults = _group_defaults(entry.cls)
    group = entry.choice.split("=")[0] if entry.choice else entry.prefix.replace(".", "/")
    out: list[OptionRow] = []
    for f in dataclasses.fields(entry.cls):
        if f.name.startswith("_") or f.name == "defaults":
            continue  # Hydra's own keys (_target_, _partial_, the defaults list)
        key = f"{entry.prefix}.{f.name}"
        if f.name in defaults:
            choices = ", ".join(f"`{c}`" for c in _group_choices(f"{group}/{f.name}"))
            meaning = f"a config group, `{group}/{f.name}=NAME`: one of {choices}"
        elif f.name in comments:
            meaning = comments[f.name]
        elif entry.comments_required:
            raise OptionDocError(
                f"{key} ({entry.cls.__module__}.{entry.cls.__name__}.{f.name}) has no comment "
                "above it. Fix: write a one-line comment above the field saying what it does."
            )
        elif f.default == entry.choice.split("=")[1]:
            meaning = f"which one this is: set by `{entry.choice}`"
        else:
            target = getattr(entry.cls, "_target_", None)
            of = f"`{target}`" if isinstance(target, str) else f"Optuna's {f.default!s} pruner"
            meaning = f"Optuna's argument `{f.name}` of {of}"
        type_name = "config group" if f.name in defaults else _type_name(hints[f.name])
        out.append(OptionRow(key, type_name, _default(f, defaults), meaning))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(key: str, entries: list[ConfigEntry] | None = None) -> str:
    """Markdown tables of a plugin (``hydra/launcher=furcate``, its nested options included)
    or of every option of a group (``hydra/sweeper/sampler``)."""
    chosen = [e for e in (entries or config_entries()) if key in (e.owner, e.owner.split("=")[0])]
    if not chosen:
        raise OptionDocError(f"<!-- options: {key} -->: no config dataclass has options there.")
    parts: list[str] = []
    for entry in chosen:
        title = f"`{entry.prefix}.*`" + (f" ({entry.choice})" if entry.choice else "")
        table = ["| option | type | default | meaning |", "|---|---|---|---|"]
        table += [
            f"| `{r.key}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.meaning)} |"
            for r in rows(entry)
        ]
        level = "###" if "=" in key else "####"  # a plugin's section, or a group's options
        parts.append(f"{level} {title}\n\n" + "\n".join(table) + "\n")
    return "\n".join(parts)


def check_details(markdown: str, entries: list[ConfigEntry]) -> None:
    """Every option a hand-written ``<!-- details: CHOICE -->`` table names must exist.

    Its rows name options relative to the plugin's key: ``mlflow.enabled`` for
    ``hydra.launcher.mlflow.enabled``.
    """
    owner: str | None = None
    known: set[str] = set()
    for line in markdown.splitlines():
        marker = DETAILS_MARKER.match(line)
        if marker:
            owner = marker.group("key")
            roots = [e for e in entries if e.choice == owner]
            if not roots:
                raise OptionDocError(f"{OPTIONS_PAGE}: <!-- details: {owner} -->: no such plugin.")
            root = roots[0].prefix + "."
            known = {r.key.removeprefix(root) for e in entries if e.owner == owner for r in rows(e)}
        elif owner and line.startswith("| `"):
            name = line.split("`")[1]
            if name not in known:
                raise OptionDocError(
                    f"{OPTIONS_PAGE}: the details table of {owner} names `{name}`, which is "
                    f"none of its options. Fix: rename or drop its row."
                )
        elif owner and line.strip() and not line.startswith("|"):
            owner = None


def expand(markdown: str) -> str:
    """Replace every options marker with its tables, after checking the details tables."""
    entries = config_entries()
    check_details(markdown, entries)
    return OPTIONS_MARKER.sub(lambda m: render(m.group("key"), entries), markdown)


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    """mkdocs hook: generate the options page's tables as the page is built."""
    if page.file.src_uri == OPTIONS_PAGE:
        return expand(markdown)
    return markdown
