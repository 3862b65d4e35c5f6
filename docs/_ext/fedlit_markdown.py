"""The method pages' equations and settings, written into their Markdown from the code.

A page's generated part sits between two comments, so that it reads on the code host as on
the site::

    <!-- fedlit-docstring fedlit.methods.FedSEAL -->
    ...the class's docstring, as Markdown...
    <!-- end fedlit-docstring -->

``fedlit-docstring PATH`` holds a class's or function's docstring without its ``Args:``
section; ``fedlit-settings PATH`` a method's settings table, ``fedlit-settings :group:
network`` (or ``optim``) the settings every method shares. The site's build reads each region
as its directive (``fedlit_docs.py``: the docstring rendered with its links); this module
fills the regions for the code host:

    python docs/_ext/fedlit_markdown.py           # rewrite the pages that changed
    python docs/_ext/fedlit_markdown.py --check   # exit 1 naming each page out of date

``tests/test_method_pages.py`` runs the check, so a page cannot drift from the code. Here
too the docstrings' ``Args:`` parsing that both use (no Sphinx is imported).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PACKAGE = "fedlit"
#: The settings every method shares, documented once (``:group: network`` and ``optim``).
SHARED_KEYS = ("network", "optim")
DOCS = Path(__file__).resolve().parents[1]
#: A generated region: its opening comment (directive, argument), its text, its closing one.
REGION = re.compile(
    r"<!-- (fedlit-docstring|fedlit-settings) ([^>]*?) -->\n(.*?)<!-- end \1 -->", re.S
)
ROLE = re.compile(r":[\w:]+:`([^`<]*?)(?:\s*<[^`>]*>)?`")
SECTION = re.compile(r"^(\s*)(Args|Returns|Raises|Attributes|Example|Examples|Note|Yields):\s*$")
#: The sections whose entries are names (``name (type): meaning``): a list item each.
NAMED = ("Args", "Raises", "Attributes")
ENTRY = re.compile(r"^(\w[\w.]*)(?: \([^)]*\))?: (.*)$")


def locate(path: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise LookupError(path)


# --- a docstring's Args: section -------------------------------------------------------------


def args_section(lines: list[str]) -> tuple[int, int, int] | None:
    """(start, end, indent) of the ``Args:`` section of a docstring's lines."""
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Args:")
    except StopIteration:
        return None
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (
        not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
    ):
        end += 1
    return start, end, indent


def without_args(lines: list[str]) -> list[str]:
    section = args_section(lines)
    if section is None:
        return lines
    start, end, _ = section
    return lines[:start] + lines[end:]


def parse_args(doc: str) -> dict[str, str]:
    """A docstring's ``Args:`` entries: name -> meaning (its lines joined)."""
    entries: dict[str, str] = {}
    lines = doc.splitlines()
    section = args_section(lines)
    if section is None:
        return entries
    start, end, indent = section
    key = None
    entry = re.compile(rf"^\s{{{indent + 4}}}(\w+)(?: \([^)]*\))?: (.*)$")
    for line in lines[start + 1 : end]:
        if not line.strip():
            continue
        match = entry.match(line)
        if match:
            key = match.group(1)
            entries[key] = match.group(2).strip()
        elif key is not None and len(line) - len(line.lstrip()) > indent + 4:
            entries[key] += " " + line.strip()
        else:
            key = None  # text of the section that is no argument ("The others: ...")
    return entries


def docstring_args(cls: type) -> dict[str, str]:
    """The ``Args:`` entries of ``cls``'s docstring and of its bases' (nearest first)."""
    found: dict[str, str] = {}
    for klass in cls.__mro__:
        doc = inspect.getdoc(klass) if "__doc__" in vars(klass) else None
        if not doc or not klass.__module__.startswith(PACKAGE):
            continue
        for key, text in parse_args(doc).items():
            found.setdefault(key, text)
    return found


def default_text(value: Any, code: Callable[[str], str]) -> str:
    """A setting's default as a table shows it, ``code`` marking it as code."""
    if value is inspect.Parameter.empty:
        return "(required)"
    if value is None:
        return code("null")
    return code(value if isinstance(value, str) else repr(value))


@dataclasses.dataclass(frozen=True)
class Row:
    """A settings table's row: the key, its default (or the dataclass a group is), meaning."""

    key: str
    default: Any
    meaning: str
    group: type | None = None


def setting_rows(path: str | None, group: str | None) -> tuple[list[Row], Any]:
    """A method's own settings (``model.init_args.<key>``, a dataclass setting field by
    field), or a shared group's; and the object whose module the meanings are written in."""
    from fedlit.methods import FederatedMethod
    from fedlit.models import Architecture
    from fedlit.objectives import Optimization

    if group == "network":
        return dataclass_rows("model.init_args.network", Architecture), Architecture
    if group == "optim":
        return dataclass_rows("model.init_args.optim", Optimization), Optimization
    if path is None:
        raise ValueError("fedlit-settings: a method's class path, or :group: network|optim")
    cls = locate(path)
    meaning = docstring_args(cls)
    rows: list[Row] = []
    for key, param in inspect.signature(cls.__init__).parameters.items():
        if key == "self" or key in SHARED_KEYS or param.kind is param.VAR_KEYWORD:
            continue
        if dataclasses.is_dataclass(param.default):
            prefix = f"model.init_args.{key}"
            rows += dataclass_rows(prefix, type(param.default), meaning.get(key))
        else:
            rows.append(Row(f"model.init_args.{key}", param.default, meaning.get(key, "")))
    return rows, cls if rows else FederatedMethod


def dataclass_rows(prefix: str, settings: type, group: str | None = None) -> list[Row]:
    """A row per field of the settings dataclass ``settings`` (a required field: no
    default), after one for the group itself where ``group`` gives its meaning."""
    meaning = docstring_args(settings)
    rows = [Row(prefix, None, group, settings)] if group else []
    for field in dataclasses.fields(settings):
        value: Any = field.default
        if field.default_factory is not dataclasses.MISSING:
            value = field.default_factory()
        elif value is dataclasses.MISSING:
            value = inspect.Parameter.empty
        rows.append(Row(f"{prefix}.{field.name}", value, meaning.get(field.name, "")))
    return rows


# --- Markdown ----------------------------------------------------------------------------------


def inline(text: str) -> str:
    """A docstring's inline reST as Markdown: ````code```` -> ```code```, a role
    (``:class:`~fedlit.x.Y```) -> its text as code (```Y```)."""
    text = re.sub(r"``(.+?)``", r"`\1`", text)

    def role(match: re.Match[str]) -> str:
        target = match.group(1).strip()
        return f"`{target.rsplit('.', 1)[-1] if target.startswith('~') else target}`"

    return ROLE.sub(role, text)


def _entries(body: list[str]) -> list[str]:
    """A named section's lines as a list: ``- `name`: meaning``, its lines joined."""
    items: list[str] = []
    for line in body:
        entry = ENTRY.match(line)
        if entry and not line.startswith(" "):
            items.append(f"- `{entry.group(1)}`: {inline(entry.group(2))}")
        elif line.strip() and items:
            items[-1] += " " + inline(line.strip())
        elif line.strip():
            items.append(inline(line.strip()))
    return items


def docstring_markdown(path: str, args: bool = False) -> str:
    """A class's or function's docstring as Markdown, without its ``Args:`` section unless
    ``args``: a function under its signature, Google-style sections in bold (the named ones
    as lists), literal blocks fenced."""
    obj = locate(path)
    lines = (inspect.getdoc(obj) or "").splitlines()
    if not args:
        lines = without_args(lines)
    out: list[str] = []
    if not inspect.isclass(obj):
        out += [f"`{path}({', '.join(inspect.signature(obj).parameters)})`", ""]
    i = 0
    while i < len(lines):
        line = lines[i]
        section = SECTION.match(line)
        if section or line.rstrip().endswith("::"):
            indent = len(line) - len(line.lstrip())
            end = i + 1
            while end < len(lines) and (
                not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
            ):
                end += 1
            body = [b[indent + 4 :] if b.strip() else "" for b in lines[i + 1 : end]]
            while body and not body[-1]:
                body.pop()
            if section and section.group(2) in NAMED:
                out += [f"**{section.group(2)}:**", "", *_entries(body)]
            elif section:
                out += [f"**{section.group(2)}:**", ""]
                out += [inline(b) for b in body if b or out[-1]]
            else:
                head = line.rstrip()[:-1].rstrip()
                out += [inline(head) + (":" if head else ""), "", "```text"]
                out += [b for b in body if b or out[-1] != "```text"] + ["```"]
            out.append("")
            i = end
            continue
        out.append(inline(line.strip()) if not line.startswith(" ") else inline(line))
        i += 1
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"


def settings_markdown(path: str | None, group: str | None) -> str:
    """A settings table in Markdown: setting, default, what it is."""
    rows, _ = setting_rows(path, group)
    if not rows:
        return "The method has no settings of its own.\n"
    table = ["| setting | default | what it is |", "| --- | --- | --- |"]
    for row in rows:
        default = (
            f"`{row.group.__qualname__}`"
            if row.group is not None
            else default_text(row.default, lambda text: f"`{text}`")
        )
        meaning = inline(row.meaning or "-").replace("|", "\\|")
        default = default.replace("|", "\\|")
        table.append(f"| `{row.key}` | {default} | {meaning} |")
    return "\n".join(table) + "\n"


def directive_options(argument: str) -> tuple[str | None, dict[str, str]]:
    """A region's argument: the object's path (or None) and its ``:name: value`` options."""
    options = dict(re.findall(r":(\w+):\s*(\S*)", argument))
    path = re.sub(r":\w+:\s*\S*", "", argument).strip() or None
    return path, options


def region_markdown(kind: str, argument: str) -> str:
    path, options = directive_options(argument)
    if kind == "fedlit-settings":
        return settings_markdown(path, options.get("group"))
    if path is None:
        raise ValueError("fedlit-docstring: a class or function path")
    return docstring_markdown(path, args="args" in options)


def regenerate(text: str) -> str:
    """``text`` with every generated region refilled from the code."""

    def fill(match: re.Match[str]) -> str:
        kind, argument = match.group(1), match.group(2)
        body = region_markdown(kind, argument)
        return f"<!-- {kind} {argument} -->\n{body}<!-- end {kind} -->"

    return REGION.sub(fill, text)


def as_directives(text: str) -> str:
    """``text`` with every generated region replaced by its directive (what the site's build
    reads: the docstring rendered with its links, as the API reference renders it)."""

    def directive(match: re.Match[str]) -> str:
        kind, argument = match.group(1), match.group(2)
        path, options = directive_options(argument)
        lines = [f"```{{{kind}}}" + (f" {path}" if path else "")]
        lines += [f":{key}: {value}".rstrip() for key, value in options.items()]
        return "\n".join([*lines, "```"])

    return REGION.sub(directive, text)


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for page in pages():
        text = page.read_text()
        fresh = regenerate(text)
        if fresh != text:
            stale.append(page)
            if not check:
                page.write_text(fresh)
    for page in stale:
        verb = "out of date" if check else "rewritten"
        print(f"{page.relative_to(DOCS.parent)}: {verb}", file=sys.stderr)
    if check and stale:
        print("run: python docs/_ext/fedlit_markdown.py", file=sys.stderr)
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(DOCS.parent))
    raise SystemExit(main(sys.argv[1:]))
