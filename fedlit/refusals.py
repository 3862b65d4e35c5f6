"""A refused setting in one sentence: the key, the value and the rule.

jsonargparse reports a value refused inside a class (a partitioner's, a method's, its
``optim``'s or ``loss``'s) as "Does not validate against any of the Union subtypes" followed by
the candidate types and a dump of the whole group; :func:`one_line` keeps the sentence that
matters: the ValueError fedlit's own validation raised (its key given in full), or
the key, the value and the rule jsonargparse found. A setting a class does not take gets its
new place when it moved (``model.init_args.client_lr`` -> ``model.init_args.optim.client_lr``).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import sys
import typing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import yaml
from jsonargparse import ArgumentParser

FEDLIT_DIR = str(Path(__file__).resolve().parent)

_KEY = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
_CLASS_PATH = re.compile(r"^- Problem with given class_path '([^']+)':$")
_NOT_ACCEPTED = re.compile(r"^Option '([^']+)' is not accepted$")
_UNRECOGNIZED = re.compile(r"^unrecognized arguments: --?([\w.]+)(?:=(.*))?$")
_GIVEN_CLASS = re.compile(r"Namespace\(class_path='([^']+)'")
_EXPECTED_ANY = re.compile(r"^Expected an? (.+?)(?:\. Got value: (.*))?$")
_CLASS = re.compile(r"<class '([\w.]+)'>")
_NESTED = re.compile(r"^Given value: NestedArg\(key='([^']*)', val=(.*)\)$")
_SUBTYPES = re.compile(r"^Subtypes: \[<class '([\w.]+)'>")
_NO_CLASS = (
    "Expected a dot import path string",
    "Expected a path but",
    "Import path",
    "Problem with given class_path",
)
_USAGE = ('expected "subcommand"', "the following arguments are required")
_NOISE = (
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Expected a <class 'NoneType'>",
    "Given value type:",
    "Given value:",
)


def raised_by_fedlit(err: BaseException) -> bool:
    """Whether ``err`` was raised by fedlit's own code (its traceback ends in fedlit)."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(FEDLIT_DIR)


def _chain(err: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def fedlit_error(err: BaseException | None) -> ValueError | None:
    """The ValueError fedlit's validation raised in ``err``'s chain (the first, which holds
    the most context where fedlit re-raised one of its own), or None."""
    found = [e for e in _chain(err) if isinstance(e, ValueError) and raised_by_fedlit(e)]
    return found[0] if found else None


def with_full_key(sentence: str, keys: Iterable[str]) -> str:
    """``sentence`` with its leading key (``tau``, ``optim.momentum``, ``model.beta``) written
    in full as the config has it (``model.init_args.loss.tau``), where exactly one key fits."""
    match = _KEY.match(sentence)
    if not match:
        return sentence
    short = match.group(0)
    keys = set(keys)
    if short in keys:
        return sentence
    fits = {
        k for k in keys if (n := k.replace(".init_args", "")) == short or n.endswith("." + short)
    }
    if len(fits) != 1:
        return sentence
    return fits.pop() + sentence[len(short) :]


def moved_to(cls: Any, name: str) -> str | None:
    """Where setting ``name``, which class ``cls`` does not take, now lives: the argument of
    ``cls`` (``network``, ``optim``, ``loss``) whose settings class has a field ``name``, or
    None."""
    try:
        parameters = inspect.signature(cls).parameters
        hints = typing.get_type_hints(cls.__init__)
    except (TypeError, ValueError, NameError):
        return None
    for parameter in parameters.values():
        settings = _settings_class(parameter, hints)
        if settings is not None and name in {f.name for f in dataclasses.fields(settings)}:
            return f"{parameter.name}.{name}"
    return None


def _settings_class(parameter: inspect.Parameter, hints: dict[str, Any]) -> type | None:
    """The settings dataclass argument ``parameter`` takes (its annotation, else its
    default's type), or None."""
    settings = hints.get(parameter.name, type(parameter.default))
    return settings if isinstance(settings, type) and dataclasses.is_dataclass(settings) else None


def _owner(cls: Any, name: str) -> str | None:
    """The name of the class that would take setting ``name`` (dotted: a group's settings
    class, e.g. ``optim.nope`` -> Optimization, ``network.nope`` -> Architecture)."""
    group, _, _ = name.rpartition(".")
    if group and cls is not None:
        try:
            parameter = inspect.signature(cls).parameters[group]
            settings = _settings_class(parameter, typing.get_type_hints(cls.__init__))
        except (TypeError, ValueError, KeyError, NameError):
            return None
        return settings.__name__ if settings is not None else None
    return getattr(cls, "__name__", None)


def _import(path: str) -> Any:
    module, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _value_in(given: str, name: str) -> str | None:
    """The value ``name`` has in jsonargparse's "Given value: {...}" (a YAML group)."""
    try:
        value = ast.literal_eval(given)
    except (ValueError, SyntaxError):
        return None
    for part in ("init_args", *name.split(".")):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif part != "init_args":
            return None
    return repr(value)


def _trainer_keys_taken(message: str) -> str:
    """After "unrecognized arguments" naming ``trainer.*`` keys (a Lightning Trainer's own,
    which fedlit's loop does not take): the ``trainer`` keys fedlit does take; else ""."""
    if not message.startswith("unrecognized arguments:"):
        return ""
    keys = re.findall(r"--(trainer\.[\w.]+)", message)
    if not keys:
        return ""
    from fedlit.federation.fit import TrainerTemplate

    taken = [f.name for f in dataclasses.fields(TrainerTemplate) if f.name != "compile"]
    return (
        f" ({', '.join(keys)}: not a setting of fedlit's loop, which fits every objective; "
        f"its trainer settings: {', '.join([*taken, 'default_root_dir', 'logger'])}; a run's "
        "length is federation.rounds, federation.local_epochs and federation.server_epochs)"
    )


def condensed(message: str) -> str:
    """jsonargparse's error report as one sentence: the full key, the value, the rule."""
    lines = [line.strip() for line in message.strip().splitlines()]
    if len(lines) <= 1 and "Namespace(" not in message:
        return message.strip() + _trainer_keys_taken(message)
    keys: list[str] = []
    cls: Any = None
    value: str | None = None
    given: str | None = None
    reasons: list[str] = []
    base: str | None = None  # the class a subclass was expected of
    for line in lines:
        if not line:
            continue
        if m := _PARSER_KEY.match(line):
            keys.append(m.group(1))
            line = m.group(2)
            if not line:
                continue
        if m := _CLASS_PATH.match(line):
            keys.append("init_args")
            cls = _import(m.group(1))
            continue
        if m := _NESTED.match(line):
            value = m.group(2).strip("'\"")
            continue
        if line.startswith("Given value: "):
            given = line.removeprefix("Given value: ")
            continue
        if m := _SUBTYPES.match(line):
            base = m.group(1).rpartition(".")[2]
        line = line.removeprefix("- ")
        if line.startswith(_NOISE):
            continue
        reasons.append(line)
    key = ".".join(keys)
    for reason in reasons:
        if m := _NOT_ACCEPTED.match(reason) or _UNRECOGNIZED.match(reason):
            name = m.group(1)
            head = name.split(".")[0]
            if "." in name and cls is not None and moved_to(cls, head) is not None:
                name, value = head, None  # a moved group given with its own settings
            full = f"{key}.{name}" if key else name
            if value is None and given is not None:
                value = _value_in(given, name)
            if value is None and m.lastindex and m.lastindex > 1:
                value = m.group(2)
            shown = f"{full}={value}" if value is not None else full
            owner = _owner(cls, name)
            sentence = f"{shown}: no such setting" + (f" of {owner}" if owner else "")
            new = moved_to(cls, name.split(".")[-1]) if cls is not None else None
            if new is not None:
                place = f"{key}.{new}" if key else new
                sentence += f"; it moved to {place}"
            return sentence
    if key and base and any(r.startswith(_NO_CLASS) for r in reasons):
        named = value if value is not None else given
        return f"{key}={named}: not a {base}; give one by class name or full class path"
    expected = [m for r in reasons if (m := _EXPECTED_ANY.match(r))]
    built = _GIVEN_CLASS.search(given or "")
    raised = [r for r in reasons if not _EXPECTED_ANY.match(r) and not r.startswith(_NO_CLASS)]
    if built and raised:  # the user's class was found, and its constructor raised
        where = f"{key}: " if key else ""
        return f"{where}{built.group(1)}(...) raised in its constructor: {raised[0]}"
    if key and reasons and len(expected) == len(reasons):  # a value of the wrong type
        kinds = [
            _CLASS.sub(r"\1", m.group(1)).replace("typing.Literal", "one of ") for m in expected
        ]
        got = [m.group(2) for m in expected if m.group(2) is not None]
        if value is None:
            value = given if given is not None else got[0] if got else None
        return f"{key}={value}: expected {' or '.join(dict.fromkeys(kinds))}"
    rule = "; ".join(dict.fromkeys(reasons)) or "refused"
    shown = f"{key}={value}" if key and value is not None else key
    return f"{shown}: {rule}" if shown else rule


def one_line(message: str, err: BaseException | None = None, keys: Iterable[str] = ()) -> str:
    """The sentence that matters in a refusal: fedlit's own ValueError in ``err``'s chain
    (its leading key written in full from ``keys``), else ``message`` condensed."""
    own = fedlit_error(err)
    if own is not None:
        first = str(own).strip().splitlines()
        if first:
            return with_full_key(first[0], keys)
    return condensed(message)


class OneLineErrors:
    """An ``error`` that prints ``error: <one sentence>`` and exits 2 (where the parser exits
    on errors; inside jsonargparse's own trials it raises as before)."""

    exit_on_error: bool

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:
            super().error(message, ex)  # type: ignore[misc]
        if message.startswith(_USAGE):  # the command line's shape, not a setting
            self.print_usage(sys.stderr)  # type: ignore[attr-defined]
        sys.stderr.write(f"error: {one_line(message, ex)}\n")
        sys.stderr.flush()
        raise SystemExit(2)


class OneLineParser(OneLineErrors, ArgumentParser):
    """jsonargparse's parser whose refusals are one sentence."""


class DuplicateKey(yaml.YAMLError):
    """A YAML mapping that gives one key twice (PyYAML keeps the last silently)."""


def duplicate_key(text: str) -> tuple[str, int, int] | None:
    """The first key a YAML mapping in ``text`` gives twice, as (its dotted key, the line of
    the second, the line of the first; lines from 1), or None. Text that is not one YAML
    document is left to the loader."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    return _repeated(node, "", set())


def _repeated(node: yaml.Node | None, prefix: str, seen: set[int]) -> tuple[str, int, int] | None:
    if node is None or id(node) in seen:  # an alias met again
        return None
    seen.add(id(node))
    children: list[tuple[str, yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            name = prefix
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                name = f"{prefix}.{key.value}" if prefix else str(key.value)
                line = key.start_mark.line + 1
                ident = (key.tag, key.value)
                if ident in first:
                    return name, line, first[ident]
                first[ident] = line
            children.append((name, value))
    elif isinstance(node, yaml.SequenceNode):
        children = [(f"{prefix}[{i}]", item) for i, item in enumerate(node.value)]
    for name, child in children:
        found = _repeated(child, name, seen)
        if found is not None:
            return found
    return None


def refuse_duplicate_keys(text: str) -> None:
    """Raise :class:`DuplicateKey` naming the key and its lines if a mapping in ``text``
    gives a key twice."""
    found = duplicate_key(text)
    if found is not None:
        key, line, first = found
        raise DuplicateKey(f"line {line}: {key} is given twice (first on line {first})")
