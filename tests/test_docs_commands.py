"""Every ``fedlit`` command written in the README and in the documentation site's pages parses
through the real CLI, without training: ``fit``, ``test``, ``partition`` and ``compare`` with
``--print_config`` added (the fully resolved config, printed, then exit 0), ``report`` through
its parser, ``--help`` as written. A command's files are those a user has: the recipes, a
comparison spec its page writes with ``cat > FILE <<'EOF'``, and a run's ``config.yaml``
(``runs/<recipe>/config.yaml``: the recipe it ran).

The commands are those of the shell code blocks and of inline code (```fedlit compare
--config ...``` in a sentence); inline dotted overrides (a results document's "every run:
```--model.init_args.network.backbone=small_cnn ...```", what a benchmark passes after
``--``) are parsed as ``fedlit fit`` of the recipe the page names last before them, so that
a key fedlit has renamed or removed cannot stay in the pages."""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from fedlit.cli import main
from fedlit.cli.report import report_parser

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(\s*)(`{3,})(.*)$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
#: A shell command that runs fedlit: ``fedlit ...``, ``.venv/bin/fedlit ...``, ``VAR=x fedlit``.
STARTS = re.compile(r"^\s*([A-Za-z_]\w*=\S*\s+)*(\S*/)?fedlit(\s|$)")


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    argv: tuple[str, ...]  # after ``fedlit``
    files: tuple[tuple[str, str], ...]  # files the block wrote before it: (path, text)

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: fedlit {shlex.join(self.argv)}"


def code_blocks(text: str) -> list[tuple[int, list[str]]]:
    """The shell code blocks of a Markdown page (```bash, ```sh, ```console or untagged;
    MyST directives such as ```{toctree} are not code): (first line number, lines)."""
    blocks: list[tuple[int, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info = match.group(2), match.group(3).strip()
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j])
            j += 1
        if info in ("", "bash", "sh", "shell", "console"):
            blocks.append((i + 2, body))
        i = j + 1
    return blocks


def commands_in(page: Path) -> list[Command]:
    found = []
    for first, body in code_blocks(page.read_text()):
        files: list[tuple[str, str]] = []
        k = 0
        while k < len(body):
            line, number = body[k], first + k
            heredoc = re.match(r"^\s*cat > (\S+) <<'?(\w+)'?\s*$", line)
            if heredoc:  # a file the block writes: kept for the commands after it
                end = body.index(heredoc.group(2), k + 1)
                files.append((heredoc.group(1), "\n".join(body[k + 1 : end]) + "\n"))
                k = end + 1
                continue
            while line.rstrip().endswith("\\") and k + 1 < len(body):  # continuation lines
                k += 1
                line = line.rstrip()[:-1] + " " + body[k].strip()
            k += 1
            for segment in re.split(r"&&|;", line):
                if not STARTS.match(segment):
                    continue
                words = shlex.split(segment, comments=True)
                while words and ASSIGNMENT.match(words[0]):  # WANDB_MODE=offline fedlit ...
                    words = words[1:]
                if words and (words[0] == "fedlit" or words[0].endswith("/fedlit")):
                    found.append(Command(page, number, tuple(words[1:]), tuple(files)))
    return found


#: Inline code: a span between single backticks, over at most one line break.
INLINE = re.compile(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)")
#: A recipe a page names (``recipes/fedseal.yaml``), not a comparison spec.
RECIPE = re.compile(r"recipes/(?!comparisons/)[\w/.-]+\.yaml")
OVERRIDE = re.compile(r"^--[a-z_]+\.[\w.]+(=|$)")
DEFAULT_RECIPE = "recipes/quickstart.yaml"


def _outside_blocks(text: str) -> str:
    """The page with its fenced blocks blanked (their lines kept, so numbers stay)."""
    lines, inside = text.splitlines(), ""
    for i, line in enumerate(lines):
        match = FENCE.match(line)
        if match and (not inside or line.strip().startswith(inside)):
            inside = "" if inside else match.group(2)
            lines[i] = ""
        elif inside:
            lines[i] = ""
    return "\n".join(lines)


def overrides_in(words: list[str]) -> list[str] | None:
    """``words`` when they are dotted overrides only (``--key=value`` or ``--key value``), not
    a setting's name alone (``--federation.resume`` in a sentence)."""
    if not words or not OVERRIDE.match(words[0]) or "=" not in words[-1] and len(words) == 1:
        return None
    for i, word in enumerate(words):
        follows_key = i > 0 and "=" not in words[i - 1] and words[i - 1].startswith("--")
        if not (OVERRIDE.match(word) or follows_key):
            return None
    return words


def _runnable(argv: list[str]) -> bool:
    """An inline command that can run as written, not one that names a command or a flag in
    a sentence (```fedlit fit```, ```fedlit report --out```) or holds a placeholder
    (``RECIPE``, ``<run>``): ``--config FILE`` given, or ``report``'s runs."""
    if not argv or any("<" in word or re.fullmatch(r"[A-Z_]{2,}", word) for word in argv):
        return False
    if argv[0] == "report":
        return any(not word.startswith("-") for word in argv[1:2])
    return "--config" in argv[:-1] or any(word.startswith("--config=") for word in argv)


def inline_commands(page: Path) -> list[Command]:
    """The page's inline ``fedlit ...`` commands, and its inline overrides as ``fedlit fit``
    of the last recipe named before them (the quick-start where none is)."""
    text = _outside_blocks(page.read_text())
    found = []
    for span in INLINE.finditer(text):
        code, line = span.group(1).replace("\n", " "), text.count("\n", 0, span.start()) + 1
        try:
            words = shlex.split(code)
        except ValueError:
            continue
        if words and words[0] == "fedlit":
            if _runnable(words[1:]):
                found.append(Command(page, line, tuple(words[1:]), ()))
            continue
        if "--" in words:  # a program's own arguments, then fedlit's overrides
            words = words[words.index("--") + 1 :]
        overrides = overrides_in(words)
        if overrides is not None and _runnable(["fit", "--config", "x", *overrides]):
            named = RECIPE.findall(text, 0, span.end())
            recipe = named[-1] if named else DEFAULT_RECIPE
            found.append(Command(page, line, ("fit", "--config", recipe, *overrides), ()))
    return found


COMMANDS = [command for page in PAGES for command in [*commands_in(page), *inline_commands(page)]]


def test_the_pages_write_fedlit_commands() -> None:
    """The extraction finds the commands (a change of the pages' format would hide them)."""
    pages = {command.page.name for command in COMMANDS}
    assert {"README.md", "getting-started.md", "comparing.md", "data-and-network.md"} <= pages
    assert {command.argv[0] for command in COMMANDS if command.argv} >= {
        *("fit", "test", "compare", "report", "partition")
    }
    assert len(COMMANDS) >= 40, len(COMMANDS)


def _prepare(command: Command, where: Path) -> None:
    """The user's folder: the recipes, the files the page wrote, and a run's config.yaml
    (``runs/<name>/config.yaml`` holds the recipe ``recipes/<name>.yaml`` it ran)."""
    (where / "recipes").symlink_to(ROOT / "recipes")
    for path, text in command.files:
        (where / path).write_text(text)
    args = list(command.argv)
    configs = [a.split("=", 1)[1] for a in args if a.startswith("--config=")]
    configs += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    for config in configs:
        target = where / config
        run = re.fullmatch(r"runs/(\w+)/config\.yaml", config)
        if not target.exists() and run and (ROOT / "recipes" / f"{run.group(1)}.yaml").exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "recipes" / f"{run.group(1)}.yaml", target)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_a_documented_command_parses(
    command: Command,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _prepare(command, tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = list(command.argv)
    if argv and argv[0] == "report":
        cfg = report_parser().parse_args(argv[1:])
        assert cfg.paths
        return
    asks_help = not argv or "--help" in argv or "-h" in argv
    if not asks_help:
        argv.append("--print_config")
    with pytest.raises(SystemExit) as done:
        main(argv)
    out, err = capsys.readouterr()
    assert done.value.code == 0, f"{command}\n{err[-2000:]}"
    if not asks_help:
        assert out.strip(), str(command)  # the resolved config
    # parsed, nothing run or written
    assert not list(tmp_path.rglob("metrics.csv")), str(command)
    assert not (tmp_path / "partition.png").exists(), str(command)


def test_the_readme_links_resolve() -> None:
    """The README's links into the site name pages that exist (the site's own links are
    checked by its strict build)."""
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert local
    assert [t for t in local if not (ROOT / t).exists()] == []
