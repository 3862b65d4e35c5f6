"""fedlit's own Sphinx extension: what the site generates from the code, so it cannot drift.

- The API reference: a page per public module of ``fedlit`` (``api/generated/``, written when
  the build starts), each public class, function and documented constant at the module that
  defines it, and the names a package re-exports listed there as links.
- A check, at the end of the build, that every public class and function of every public
  module is documented (a warning, so an error under ``-W``, naming each one missing).
- Cross-references to a re-exported or imported name (``fedlit.methods.FedAvgFixMatch``,
  ``FederatedMethod`` in a module that imports it) resolved to where the object is defined;
  references to other packages (torch, Lightning, the standard library) left as text, without
  a warning; a reference into ``fedlit`` that resolves nowhere stays an error.
- ``fedlit-help``: a command's own ``--help``, run in-process as the build runs.
- ``fedlit-settings``: a method's own settings (``model.init_args``), their defaults from its
  signature and their meaning from its docstring; ``:group: network`` and ``:group: optim``
  give the settings every method shares.
- The method pages' generated Markdown (``fedlit_markdown.py``: the same docstrings and
  tables, written into the pages for the code host) read as those two directives.
- The "Module code" index without the modules it has no page for (an object whose
  ``__module__`` is ``builtins`` was listed there, a link to a page never written).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import io
import os
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from docutils import nodes
from docutils.parsers.rst import Parser, directives
from docutils.utils import new_document
from fedlit_markdown import (
    PACKAGE,
    as_directives,
    default_text,
    locate,
    setting_rows,
    without_args,
)
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOG = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------
# The public modules and their public names
# --------------------------------------------------------------------------------------------


@functools.cache
def public_modules() -> tuple[str, ...]:
    """Every module of the package none of whose dotted parts starts with ``_``."""
    root = importlib.import_module(PACKAGE)
    names = [PACKAGE] + [m.name for m in pkgutil.walk_packages(root.__path__, PACKAGE + ".")]
    return tuple(sorted(n for n in names if not any(p.startswith("_") for p in n.split("."))))


@functools.cache
def _top_level(name: str) -> dict[str, tuple[int, bool]]:
    """A module's top-level names as its source defines them: name -> (line, assigned), the
    second true for a constant (an assignment), false for a ``def`` or ``class``."""
    tree = ast.parse(inspect.getsource(importlib.import_module(name)))
    found: dict[str, tuple[int, bool]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, (node.lineno, False))
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    found.setdefault(leaf.id, (node.lineno, True))
    return found


def _documented_data(module: ModuleType) -> set[str]:
    """Module constants with a ``#:`` comment (autodoc's attribute documentation)."""
    from sphinx.pycode import ModuleAnalyzer

    analyzer = ModuleAnalyzer.for_module(module.__name__)
    return {name for (scope, name) in analyzer.find_attr_docs() if scope == ""}


def is_code(obj: Any) -> bool:
    return inspect.isclass(obj) or inspect.isfunction(obj)


@dataclasses.dataclass
class ModuleNames:
    """A module's public names: those it defines (documented on its page) and those it
    re-exports (``__all__`` names defined elsewhere, linked)."""

    defined: list[str]
    reexported: list[str]


@functools.cache
def module_names(name: str) -> ModuleNames:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    top = _top_level(name)

    def defined_here(key: str) -> bool:
        obj = getattr(module, key)
        if inspect.ismodule(obj):
            return False
        if is_code(obj):
            return obj.__module__ == name
        return key in top and top[key][1]

    public = [k for k in vars(module) if not k.startswith("_")]
    order = list(exported or []) + [k for k in public if k not in (exported or [])]
    defined, reexported = [], []
    for key in order:
        obj = getattr(module, key)
        if inspect.ismodule(obj):
            continue
        if defined_here(key):
            defined.append(key)
        elif exported is not None and key in exported:
            reexported.append(key)
    defined.sort(key=lambda k: top.get(k, (10**9, False))[0])  # the source's order
    return ModuleNames(defined, reexported)


_DEFINITIONS: dict[str, str] | None = None


def definitions() -> dict[str, str]:
    """Every public constant's home: ``module.NAME`` of the module that defines it, for each
    name a package re-exports."""
    global _DEFINITIONS
    if _DEFINITIONS is None:
        found: dict[str, str] = {}
        for name in public_modules():
            for key in module_names(name).defined:
                found.setdefault(key, name)
        _DEFINITIONS = found
    return _DEFINITIONS


def canonical(obj: Any, key: str, where: str) -> str | None:
    """Where ``obj`` (named ``key`` in module ``where``) is documented."""
    if is_code(obj):
        return f"{obj.__module__}.{obj.__qualname__}"
    home = definitions().get(key)
    if home is not None and getattr(importlib.import_module(home), key, None) is obj:
        return f"{home}.{key}"
    return None


# --------------------------------------------------------------------------------------------
# The API pages
# --------------------------------------------------------------------------------------------


def module_page(name: str) -> str:
    names = module_names(name)
    title = f"``{name}``"
    module = importlib.import_module(name)
    code = [k for k in names.defined if is_code(getattr(module, k))]
    data = [k for k in names.defined if k not in code]
    lines = [title, "=" * len(title), "", f".. automodule:: {name}"]
    if code:
        lines += [f"   :members: {', '.join(code)}", "   :undoc-members:"]
    lines.append("")
    documented = _documented_data(module)
    for key in data:  # autodoc's module members leave out constants without a ``#:`` comment
        value = repr(getattr(module, key))
        short = len(value) <= 120 and "\n" not in value
        if key in documented:
            lines.append(f".. autodata:: {name}.{key}")
            if not short:
                lines.append("   :no-value:")
        else:  # autodata would give the docstring of the value's type
            lines.append(f".. py:data:: {key}")  # in the module automodule set
            if short:
                lines.append(f"   :value: {value}")
        lines.append("")
    if names.reexported:
        lines += ["", "Also here, from the modules that define them:", ""]
        for key in names.reexported:
            target = canonical(getattr(module, key), key, name)
            if target is None:
                LOG.warning("api: %s.%s: no documented definition found", name, key)
                continue
            lines.append(f"- :py:obj:`{key} <{target}>` (``{target}``)")
        lines.append("")
    subs = [m for m in public_modules() if m.rsplit(".", 1)[0] == name and m != name]
    if subs:
        lines += ["", ".. toctree::", "   :maxdepth: 1", ""]
        lines += [f"   {m}" for m in subs]
        lines.append("")
    return "\n".join(lines)


def write_api_pages(app: Sphinx) -> None:
    """``api/generated/<module>.rst`` for each public module; a file is rewritten only when
    its text changes (so an incremental build rereads only what changed)."""
    out = Path(app.srcdir) / "api" / "generated"
    out.mkdir(parents=True, exist_ok=True)
    wanted = {}
    for name in public_modules():
        wanted[f"{name}.rst"] = module_page(name)
    for stale in out.glob("*.rst"):
        if stale.name not in wanted:
            stale.unlink()
    for file, text in wanted.items():
        path = out / file
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


#: The notebooks shown on the site, each as a page of ``notebooks/`` (written when the build
#: starts, never run: the notebook is kept without outputs, ``tests/test_notebook.py`` runs it).
NOTEBOOKS = ("quickstart",)


def notebook_page(notebook: Path) -> str:
    """A notebook as a Markdown page: its Markdown cells as they are, its code cells as
    Python blocks, after a line that says where it is and how to run it."""
    import json

    cells = json.loads(notebook.read_text())["cells"]
    where = f"notebooks/{notebook.name}"
    parts = [
        f"*This page is `{where}`, shown without running it. Run it in JupyterLab: "
        f"`bash .ci/install notebook && .venv/bin/jupyter lab {where}`.*"
    ]
    for cell in cells:
        text = "".join(cell["source"]).rstrip()
        if cell["cell_type"] == "markdown":
            parts.append(text)
        elif cell["cell_type"] == "code" and text:
            parts.append(f"```python\n{text}\n```")
    first, rest = parts[1], parts[2:]  # the notebook's title first, then the line
    return "\n\n".join([first, parts[0], *rest]) + "\n"


def write_notebook_pages(app: Sphinx) -> None:
    """``notebooks/<name>.md`` for each of :data:`NOTEBOOKS`, rewritten only when its text
    changes."""
    out = Path(app.srcdir) / "notebooks"
    out.mkdir(exist_ok=True)
    for name in NOTEBOOKS:
        text = notebook_page(Path(app.srcdir).parent / "notebooks" / f"{name}.ipynb")
        path = out / f"{name}.md"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def check_api_coverage(app: Sphinx, env: Any) -> None:
    """Every public class and function of every public module is documented somewhere."""
    objects = env.get_domain("py").objects
    for name in public_modules():
        module = importlib.import_module(name)
        names = module_names(name)
        for key in names.defined + names.reexported:
            obj = getattr(module, key)
            if not is_code(obj):
                continue
            target = canonical(obj, key, name)
            if target not in objects:
                LOG.warning("api: %s.%s is not in the API reference (%s)", name, key, target)


# --------------------------------------------------------------------------------------------
# Cross-references
# --------------------------------------------------------------------------------------------


#: The object a dotted path names (:func:`fedlit_markdown.locate`), looked up once.
_locate = functools.cache(locate)


@functools.cache
def _canonical_path(path: str) -> str | None:
    """Where the object ``path`` names is documented: its defining module's name for a class
    or function, the class that defines it for a member."""
    parts = path.split(".")
    try:
        obj = _locate(path)
    except (LookupError, AttributeError):
        return _instance_attribute(path)
    if inspect.ismodule(obj):
        return obj.__name__
    if is_code(obj) or inspect.ismethod(obj):
        target = getattr(obj, "__func__", obj)
        return f"{target.__module__}.{target.__qualname__}"
    # a class member that is no function (a property, a class attribute), or a constant
    try:
        owner = _locate(".".join(parts[:-1]))
    except (LookupError, AttributeError):
        return None
    if inspect.isclass(owner):
        for cls in owner.__mro__:
            if parts[-1] in vars(cls):
                if isinstance(vars(cls)[parts[-1]], property):
                    fget = vars(cls)[parts[-1]].fget
                    return f"{fget.__module__}.{fget.__qualname__}"
                return f"{cls.__module__}.{cls.__qualname__}.{parts[-1]}"
        return None
    if inspect.ismodule(owner):
        return canonical(obj, parts[-1], owner.__name__)
    return None


_IMPORTS: dict[str, dict[str, str]] = {}
_BUILTINS = frozenset(dir(builtins))


@functools.cache
def _foreign(head: str) -> bool:
    """An importable top-level module other than fedlit (torch, collections, ...)."""
    if head == PACKAGE or not head.isidentifier():
        return False
    try:
        return importlib.util.find_spec(head) is not None
    except (ImportError, ValueError):
        return False


def imported_names(modname: str) -> dict[str, str]:
    """Every ``from X import Y [as Z]`` of a module's source, ``typing.TYPE_CHECKING`` blocks
    included: Z -> ``X.Y`` (the names its string annotations may use)."""
    if modname not in _IMPORTS:
        found: dict[str, str] = {}
        try:
            module = importlib.import_module(modname)
            tree = ast.parse(inspect.getsource(module))
        except (ImportError, OSError, TypeError, SyntaxError):
            tree = ast.Module(body=[], type_ignores=[])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    found[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    found[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        _IMPORTS[modname] = found
    return _IMPORTS[modname]


def _through_imports(node: Any) -> str | None:
    """The target with its first part replaced by what the module imported under that name."""
    target = node["reftarget"].lstrip(".~")
    modname = _context(node)[0]
    if not modname:
        return None
    head, _, rest = target.partition(".")
    source = imported_names(modname).get(head)
    if source is None:
        return None
    return f"{source}.{rest}" if rest else source


def _context(node: Any) -> tuple[str | None, str | None]:
    """The module and class a reference is written in; an API page's module where Sphinx
    gives none (a field's type)."""
    modname, clsname = node.get("py:module"), node.get("py:class")
    if not modname:
        doc = str(node.get("refdoc", ""))
        if doc.startswith("api/generated/"):
            modname = doc.removeprefix("api/generated/")
    return modname, clsname


def _candidates(node: Any) -> list[str]:
    """The dotted paths a reference may mean: as written, then relative to the class it is
    written in and that class's bases (their modules too), then to the module."""
    target = node["reftarget"].lstrip(".~")
    modname, clsname = _context(node)
    if target in _BUILTINS or _foreign(target.split(".")[0]):
        return []
    found = [target]
    if modname and clsname:
        found.append(f"{modname}.{clsname}.{target}")
        try:
            owner = _locate(f"{modname}.{clsname}")
        except (LookupError, AttributeError):
            owner = None
        if inspect.isclass(owner):
            for cls in owner.__mro__[1:]:
                if cls.__module__.startswith(PACKAGE):
                    found.append(f"{cls.__module__}.{cls.__qualname__}.{target}")
                    found.append(f"{cls.__module__}.{target}")
    if modname:
        found.append(f"{modname}.{target}")
    imported = _through_imports(node)
    if imported is not None:
        found.append(imported)
    return [c for c in dict.fromkeys(found) if c == PACKAGE or c.startswith(PACKAGE + ".")]


def _instance_attribute(path: str) -> str | None:
    """An attribute a class's instances are given (``self.<name> = ...`` in its source), which
    autodoc does not document: the class, where its constructor describes it."""
    owner_path, _, name = path.rpartition(".")
    try:
        owner = _locate(owner_path)
    except (LookupError, AttributeError):
        return None
    if not inspect.isclass(owner) or not owner.__module__.startswith(PACKAGE):
        return None
    for cls in owner.__mro__:
        if cls.__module__.startswith(PACKAGE) and re.search(
            rf"\bself\.{re.escape(name)}\b\s*[:=]", _source(cls)
        ):
            return f"{cls.__module__}.{cls.__qualname__}"
    return None


@functools.cache
def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def _find(node: Any, domain: Any) -> str | None:
    for candidate in _candidates(node):
        path = _canonical_path(candidate)
        if path is not None and (path in domain.objects or path in domain.modules):
            return path
    return None


class ThroughNamespaces(SphinxPostTransform):
    """Before Sphinx resolves references: a ``fedlit`` name that is not documented where it
    is written (``StateDict`` in a module that imports it; a package's re-export) is pointed
    at the object's own documentation, so that Sphinx's search never guesses between two
    objects of one name."""

    default_priority = 5  # before sphinx.transforms.post_transforms.ReferencesResolver

    def run(self, **kwargs: Any) -> None:
        domain = self.env.get_domain("py")
        for node in self.document.findall(addnodes.pending_xref):
            if node.get("refdomain") != "py":
                continue
            target = node["reftarget"].lstrip(".~")
            modname = _context(node)[0]
            if target in domain.objects or (modname and f"{modname}.{target}" in domain.objects):
                continue
            found = _find(node, domain)
            if found is not None:
                node["reftarget"], node["refspecific"] = found, False
                if node["reftype"] != "mod":
                    node["reftype"] = "obj"


def resolve_reexports(
    app: Sphinx, env: Any, node: Any, contnode: nodes.Element
) -> nodes.Element | None:
    """A ``fedlit`` reference that Sphinx did not find, through the object it names: the
    target as written, then relative to the current class (and its bases) and module; last,
    the one documented ``fedlit`` object whose name ends with it, where there is one."""
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    found = _find(node, domain)
    if found is None:
        tail = "." + node["reftarget"].lstrip(".~")
        matches = [n for n in domain.objects if n.endswith(tail) and n.startswith(PACKAGE)]
        if len(matches) == 1:
            found = matches[0]
    if found is None:
        return None
    typ = "mod" if found in domain.modules and found not in domain.objects else "obj"
    return domain.resolve_xref(env, node["refdoc"], app.builder, typ, found, node, contnode)


def _external(node: Any) -> bool:
    """A reference to something that is not fedlit's public API, left as text: a name of
    another package (torch, lightning, numpy, typing...: its first part an importable module
    other than fedlit, or a name the module imported from one), a private name (a part
    starting with ``_``) or a type variable."""
    target = node["reftarget"].lstrip(".~")
    head = target.split(".")[0]
    if not head:
        return False
    if not re.fullmatch(r"[\w.]+", target):
        # a piece of a signature Sphinx could not parse whole (a dataclass field's default
        # ``<factory>`` breaks its parser, which then splits ``dict[str, Any]`` at the comma)
        return True
    if any(part.startswith("_") for part in target.split(".")):
        return True
    if target in _BUILTINS or _foreign(head):
        return True
    imported = _through_imports(node)
    if imported is not None and not imported.startswith(PACKAGE):
        return True
    for candidate in _candidates(node):
        try:
            obj = _locate(candidate)
        except (LookupError, AttributeError, ImportError):
            continue
        if isinstance(obj, TypeVar):
            return True
        home = getattr(obj, "__module__", None) if is_code(obj) else None
        if home is not None and not home.startswith(PACKAGE):
            return True
    return False


def quiet_external(app: Sphinx, domain: Any, node: Any) -> bool | None:
    if domain is not None and domain.name == "py" and _external(node):
        return True
    if os.environ.get("FEDLIT_DOCS_DEBUG"):
        LOG.warning("unresolved: %r", {k: node.get(k) for k in node.attributes})
    return None


_SAVED: dict[int, list[str]] = {}
_LITERAL = re.compile(r"(``.*?``|:\w+:`[^`]*`|`[^`]*`)")


def keep_attribute_docs(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Before napoleon: an attribute's or constant's docstring is saved, and restored after
    it (:func:`restore_attribute_docs`): napoleon would read its first line's ``text: more``
    as a type, ``text``."""
    if what in ("attribute", "data", "property"):
        _SAVED[id(lines)] = list(lines)


def restore_attribute_docs(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    saved = _SAVED.pop(id(lines), None)
    if saved is not None:
        lines[:] = saved


def others_out_of_args(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """ "The others: see X." closing an ``Args:`` section is a sentence, not an argument named
    ``others`` of type ``The`` (napoleon's reading): moved after the section, as a paragraph."""
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (
        not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
    ):
        end += 1
    for i in range(start + 1, end):
        if lines[i].strip().startswith("The others:"):
            stop = i + 1
            deeper = len(lines[i]) - len(lines[i].lstrip())
            while (
                stop < end
                and lines[stop].strip()
                and (len(lines[stop]) - len(lines[stop].lstrip()) > deeper)
            ):
                stop += 1
            sentence = " ".join(line.strip() for line in lines[i:stop])
            del lines[i:stop]
            end -= stop - i
            while end > start + 1 and not lines[end - 1].strip():
                end -= 1
            lines[end:end] = ["", " " * indent + sentence, ""]
            return


def escape_bars(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """``|G_i|``, ``||psi||_1``, ``|D_KL - beta|``: sizes and norms in plain text, which reST
    would read as substitutions: every bar outside literals and roles escaped (docstrings use
    no substitution and no table)."""
    for i, line in enumerate(lines):
        parts = _LITERAL.split(line)
        for j in range(0, len(parts), 2):  # the text between literals and roles
            parts[j] = parts[j].replace("|", "\\|")
        lines[i] = "".join(parts)


# --------------------------------------------------------------------------------------------
# Directives
# --------------------------------------------------------------------------------------------


def parse_rst(directive: SphinxDirective, text: str) -> list[nodes.Node]:
    """reStructuredText parsed in place, from a Markdown page as from a reST one (the roles
    of docstrings: ``:class:``, ``:meth:``, ...)."""
    document = new_document(directive.state.document["source"], directive.state.document.settings)
    document.reporter = directive.state.document.reporter
    Parser().parse(text, document)
    return list(document.children)


@contextlib.contextmanager
def written_in(directive: SphinxDirective, obj: Any) -> Iterator[None]:
    """Text taken from ``obj``'s docstring, parsed with its references relative to ``obj``'s
    module and class, as they are written."""
    context = directive.env.ref_context
    saved = dict(context)
    context["py:module"] = obj.__module__
    if inspect.isclass(obj):
        context["py:class"] = obj.__qualname__
    try:
        yield
    finally:
        context.clear()
        context.update(saved)


class FedlitHelp(SphinxDirective):
    """``fedlit <command> --help`` as the command prints it (in-process, at a fixed width)."""

    optional_arguments = 1
    final_argument_whitespace = True

    def run(self) -> list[nodes.Node]:
        from fedlit.cli import main

        words = self.arguments[0].split() if self.arguments else []
        root = Path(__file__).resolve().parents[2]  # a recipe named from the repository's root
        words = [
            f"--config={root / w.split('=', 1)[1]}" if w.startswith("--config=") else w
            for w in words
        ]
        out = io.StringIO()
        old = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = "100"
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                try:
                    main([*words, "--help"])
                except SystemExit as end:
                    if end.code not in (0, None):
                        command = " ".join(["fedlit", *words, "--help"])
                        raise self.error(f"{command} exited {end.code}") from None
        finally:
            if old is None:
                del os.environ["COLUMNS"]
            else:
                os.environ["COLUMNS"] = old
        text = out.getvalue().rstrip()
        return [nodes.literal_block(text, text, language="text")]


class FedlitDocstring(SphinxDirective):
    """The docstring of a class or function of fedlit, rendered in place as the API reference
    renders it (napoleon's sections, the roles resolved in the object's own module), without
    its ``Args:`` section unless ``:args:`` is given (``fedlit-settings`` tabulates a
    method's)."""

    required_arguments = 1
    option_spec = {"args": directives.flag}

    def run(self) -> list[nodes.Node]:
        from sphinx.ext.napoleon import Config
        from sphinx.ext.napoleon.docstring import GoogleDocstring

        path = self.arguments[0]
        obj = _locate(path)
        lines = (inspect.getdoc(obj) or "").splitlines()
        if "args" not in self.options:
            lines = without_args(lines)
        what = "class" if inspect.isclass(obj) else "function"
        escape_bars(self.env.app, what, path, obj, None, lines)
        others_out_of_args(self.env.app, what, path, obj, None, lines)
        config = Config(napoleon_use_ivar=True, napoleon_use_rtype=False)
        text = str(GoogleDocstring(lines, config, what=what, name=path, obj=obj))
        if what == "function":  # its fields (parameters, returns) under its signature
            names = ", ".join(inspect.signature(obj).parameters)
            body = "\n".join(f"   {line}" if line else "" for line in text.splitlines())
            text = f".. py:function:: {path}({names})\n   :no-index:\n\n{body}"
        with written_in(self, obj):
            return parse_rst(self, text + "\n")


class FedlitSettings(SphinxDirective):
    """A table of settings with their defaults and meanings, read from the code.

    ``fedlit-settings:: fedlit.methods.FedSEAL``: the method's own settings
    (``model.init_args.<key>``, its ``loss`` field by field); ``:group: network`` or
    ``:group: optim``: the settings every method shares."""

    optional_arguments = 1
    option_spec = {"group": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        try:
            rows, owner = setting_rows(
                self.arguments[0] if self.arguments else None, self.options.get("group")
            )
        except ValueError as err:
            raise self.error(str(err)) from None
        if not rows:
            return parse_rst(self, "The method has no settings of its own.\n")
        table = [
            ".. list-table::",
            "   :header-rows: 1",
            "   :widths: 30 15 55",
            "",
            "   * - setting",
            "     - default",
            "     - what it is",
        ]
        for row in rows:
            if row.group is not None:
                name = f"{row.group.__module__}.{row.group.__qualname__}"
                default = f":py:class:`~{name}`"
            else:
                default = default_text(row.default, lambda text: f"``{text}``")
            cell = [row.meaning or "-"]
            escape_bars(self.env.app, "class", row.key, owner, None, cell)
            table += [f"   * - ``{row.key}``", f"     - {default}", f"     - {cell[0]}"]
        with written_in(self, owner):
            return parse_rst(self, "\n".join(table) + "\n")


def generated_as_directives(app: Sphinx, docname: str, source: list[str]) -> None:
    """A page's generated regions (``fedlit_markdown.py``) read as their directives."""
    source[0] = as_directives(source[0])


def modules_with_pages(app: Sphinx) -> list[Any]:
    """Before viewcode writes its pages: the modules it found no source for are dropped, so
    that its index does not link to pages it never writes."""
    found = getattr(app.env, "_viewcode_modules", None)
    if found:
        for name in [name for name, entry in found.items() if not entry]:
            del found[name]
    return []


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("builder-inited", write_api_pages)
    app.connect("builder-inited", write_notebook_pages)
    app.connect("source-read", generated_as_directives)
    app.connect("html-collect-pages", modules_with_pages, priority=400)
    app.connect("env-check-consistency", check_api_coverage)
    app.connect("missing-reference", resolve_reexports)
    app.connect("autodoc-process-docstring", escape_bars, priority=400)
    app.connect("autodoc-process-docstring", others_out_of_args, priority=400)
    app.connect("autodoc-process-docstring", keep_attribute_docs, priority=450)
    app.connect("autodoc-process-docstring", restore_attribute_docs, priority=550)
    app.connect("warn-missing-reference", quiet_external)
    app.add_post_transform(ThroughNamespaces)
    app.add_directive("fedlit-help", FedlitHelp)
    app.add_directive("fedlit-settings", FedlitSettings)
    app.add_directive("fedlit-docstring", FedlitDocstring)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
