"""The documentation's generated Markdown matches the code: the method pages' equations and
settings (``docs/_ext/fedlit_markdown.py``, readable on the code host), the site's version
and the changelog's releases."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import fedlit

DOCS = Path(__file__).parents[1] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import fedlit_markdown  # noqa: E402 (docs/_ext is no package)


def test_the_method_pages_hold_what_the_code_says() -> None:
    """Regenerated from the code, every page is unchanged: a docstring or a default changed
    without ``python docs/_ext/fedlit_markdown.py`` fails here."""
    stale = [
        str(page.relative_to(DOCS))
        for page in fedlit_markdown.pages()
        if fedlit_markdown.regenerate(page.read_text()) != page.read_text()
    ]
    assert stale == [], "run: python docs/_ext/fedlit_markdown.py"


def test_no_method_page_shows_a_raw_directive() -> None:
    """On the code host a ```{fedlit-docstring}``` fence shows raw: every one is a region."""
    pages = list((DOCS / "methods").glob("*.md"))
    assert len(pages) >= 12
    raw = [p.name for p in pages if re.search(r"```\{fedlit-(docstring|settings)\}", p.read_text())]
    assert raw == []
    regions = sum(len(fedlit_markdown.REGION.findall(p.read_text())) for p in pages)
    assert regions >= 45


def test_a_region_is_filled_from_the_code_and_read_back_as_its_directive() -> None:
    text = (
        "<!-- fedlit-settings fedlit.methods.FedSEAL -->\nstale\n<!-- end fedlit-settings -->\n"
        "<!-- fedlit-docstring fedlit.objectives.class_thresholds :args: -->\n"
        "<!-- end fedlit-docstring -->\n"
    )
    filled = fedlit_markdown.regenerate(text)
    assert "stale" not in filled
    assert (
        "| `model.init_args.bootstrap_epochs` | `10` | server epochs on the labeled set" in filled
    )
    assert "`fedlit.objectives.class_thresholds(probs, labels)`" in filled
    assert "- `labels`: (N,) true labels." in filled  # :args: keeps the arguments
    assert fedlit_markdown.regenerate(filled) == filled
    assert fedlit_markdown.as_directives(filled) == (
        "```{fedlit-settings} fedlit.methods.FedSEAL\n```\n"
        "```{fedlit-docstring} fedlit.objectives.class_thresholds\n:args:\n```\n"
    )


@pytest.mark.parametrize(
    ("rst", "markdown"),
    [
        ("``x``", "`x`"),
        (":class:`~fedlit.methods.FedSEAL`", "`FedSEAL`"),
        (":meth:`FedSEALLoss.weight`", "`FedSEALLoss.weight`"),
        (":class:`the loss <fedlit.objectives.FedSEALLoss>`", "`the loss`"),
    ],
)
def test_inline_rest_becomes_markdown(rst: str, markdown: str) -> None:
    assert fedlit_markdown.inline(rst) == markdown


def test_the_changelog_names_the_packages_version() -> None:
    """The site's version is the package's (docs/conf.py), and the changelog lists it."""
    changes = (DOCS / "changes.md").read_text()
    releases = re.findall(r"^### (\S+)", changes, re.M)
    assert releases[0] == "Unreleased" and releases[1] == fedlit.__version__
    assert "release = version = __version__" in (DOCS / "conf.py").read_text()
