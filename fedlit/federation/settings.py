"""The flat config of a run made through the Python API, in the form ``fedlit fit`` records
(``hparams.yaml``: ``seed_everything``, ``trainer.*``, ``model.*``, ``data.*``,
``federation.*``), read from the objects the run was given: the typed ``__init__`` arguments
of the method and the data module are the config's schema. The method's values are its
hyperparameters (Lightning's ``save_hyperparameters``), the data module's its checked
settings (:class:`~fedlit.data.draw.DataSettings`), the federation's and the trainer's their
dataclasses' fields. A value that cannot be known (a torch Dataset, a logger, an argument an
object does not keep) is left out, never guessed."""

from __future__ import annotations

import inspect
from dataclasses import fields, is_dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from fedlit.data.datamodule import FederatedDataModule
from fedlit.data.sources import BuiltIn, Files, TorchDatasets
from fedlit.federation.callbacks import RunView
from fedlit.run_layout import flat_config

#: A value the record leaves out: it cannot be written as a setting.
_UNKNOWN = object()

#: How deep the record follows objects within objects.
_DEPTH = 8


def recorded_settings(run: RunView) -> dict[str, Any]:
    """The flat config of ``run``, dotted keys, as ``fedlit fit`` records it for the same run.

    As the CLI records them, the network's ``num_classes``, ``in_channels`` and ``image_size``
    are null where they are the data's own (the CLI sets them from the data), and
    ``data.client_pool`` is null where it is the data set's default; ``trainer.logger`` is
    false for a run without loggers and left out for one with loggers."""
    method, data, trainer = run.method, run.data, run.trainer
    settings: dict[str, Any] = {"seed_everything": run.seed}
    settings["trainer"] = trainer.settings() | {"default_root_dir": str(run.run_dir)}
    if not run.loggers:
        settings["trainer"]["logger"] = False
    given = method.hparams  # its arguments, not what Lightning's CLI adds (``_class_path``)
    args = {name: given[name] for name in _init_args(type(method)) or given if name in given}
    settings["model"] = _as_class(method, args)
    network = settings["model"]["init_args"].get("network")
    if isinstance(network, dict):
        own = {"num_classes": data.num_classes, "in_channels": data.in_channels}
        own["image_size"] = data.image_shape[-1]
        network.update({key: None for key, value in own.items() if network.get(key) == value})
    settings["data"] = _data_settings(data)
    settings["federation"] = _value(run.config)
    return flat_config(settings)


def _data_settings(data: FederatedDataModule) -> dict[str, Any]:
    """The data module's arguments, from its checked settings (the clients' number and size
    as the data set decided them, as the CLI records them)."""
    given = data.settings
    source = given.source
    values: dict[str, Any] = {}
    for name in _init_args(type(data)) or ():
        if name == "dataset":
            value = source.name if isinstance(source, BuiltIn | Files) else _UNKNOWN
        elif name == "root":
            value = str(given.root)
        elif name == "client_pool":
            value = None if given.client_pool == _default_pool(data) else given.client_pool
        elif name == "test_dataset":
            test = source.test if isinstance(source, TorchDatasets) else None
            value = None if test is None else _UNKNOWN
        else:
            value = _value(getattr(given, name, _UNKNOWN))
        if value is not _UNKNOWN:
            values[name] = value
    return values


def _default_pool(data: FederatedDataModule) -> str | None:
    """The client pool the data set gives where ``data.client_pool`` is unset (None where it
    can give none with this partitioner: the pool was asked for)."""
    try:
        return data.settings.source.client_pool(None, data.settings.partitioner)
    except ValueError:
        return None


def _init_args(cls: type) -> list[str] | None:
    """The names of ``cls``'s ``__init__`` arguments (its config schema), ``self`` aside;
    None where they cannot be named (``*args``, ``**kwargs``, no signature)."""
    try:
        params = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
        return None
    return [p.name for p in params if p.kind != p.POSITIONAL_ONLY]


def _value(value: Any, depth: int = 0) -> Any:
    """A value as the CLI's config holds it: a dataclass as its fields, a list as a tuple,
    another object as its ``class_path`` and the ``init_args`` it keeps as attributes; an
    array, a class, a function, or an object nested deeper than :data:`_DEPTH`, unknown."""
    if value is None or value is _UNKNOWN or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return _value(value.item(), depth)
    if depth >= _DEPTH or isinstance(value, Tensor | np.ndarray):
        return _UNKNOWN
    if inspect.isclass(value) or inspect.isroutine(value):
        return _UNKNOWN  # not a setting the CLI writes so
    if isinstance(value, Path):
        return str(value)
    if is_dataclass(value):
        items = {f.name: getattr(value, f.name) for f in fields(value) if f.init}
        return _known(items, depth)
    if isinstance(value, dict):
        return _known({str(key): item for key, item in value.items()}, depth)
    if isinstance(value, list | tuple):
        listed = tuple(_value(item, depth + 1) for item in value)
        return _UNKNOWN if any(item is _UNKNOWN for item in listed) else listed
    names = _init_args(type(value))
    kept = {name: _attribute(value, name) for name in names or ()}
    known = _as_class(value, kept, depth)
    complete = names is not None and len(known["init_args"]) == len(kept)
    return known if complete else _UNKNOWN  # an argument it does not keep: unknown


def _attribute(obj: object, name: str) -> Any:
    """``obj``'s attribute ``name``, or unknown where reading it fails (a user's property
    may raise anything)."""
    try:
        return getattr(obj, name)
    except Exception:  # noqa: BLE001 - any failure means the value is not known
        return _UNKNOWN


def _known(items: dict[str, Any], depth: int) -> dict[str, Any]:
    """``items``' values as the CLI's config holds them, the unknown left out."""
    values = {key: _value(item, depth + 1) for key, item in items.items()}
    return {key: item for key, item in values.items() if item is not _UNKNOWN}


def _as_class(obj: object, args: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """``obj`` as a class-typed setting: its class's import path and its known arguments."""
    return {"class_path": import_path(type(obj)), "init_args": _known(args, depth)}


def import_path(cls: type) -> str:
    """The shortest dotted path that imports ``cls`` (``fedlit.methods.FedAvgFixMatch``), as
    the CLI's parser writes a ``class_path`` it resolved."""
    parts = cls.__module__.split(".")
    for end in range(1, len(parts) + 1):
        module = ".".join(parts[:end])
        try:
            found = getattr(import_module(module), cls.__qualname__, None)
        except ImportError:  # a module made at run time, not importable by its name
            continue
        if found is cls:
            return f"{module}.{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"
