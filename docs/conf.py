"""Sphinx configuration of fedlit's documentation site.

Built strictly (``-W -n``: a warning, a broken cross-reference or a docstring that does not
render fails the build) and offline: no intersphinx inventory, no remote theme or asset.
References to other packages (torch, Lightning, the standard library) are left as text; every
reference to ``fedlit`` must resolve (``_ext/fedlit_docs.py``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))  # this checkout's fedlit, installed or not
os.environ.setdefault("FEDLIT_CPU_BF16", "0")  # importing fedlit probes no CPU feature

from fedlit import __version__  # noqa: E402 (after the path above)

project = "fedlit"
author = "the fedlit authors"
copyright = "fedlit's authors"  # noqa: A001 (Sphinx's name)
# The package's version, its one home: in each page's title and the sidebar.
release = version = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "fedlit_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = [
    "_build",
    # the preface of docs/results/fedseal.md (benchmarks/fedseal_diagnosis.py --preface), whose
    # report holds it whole: published there
    "results/fedseal_reading.md",
]

# Strict: every cross-reference must resolve (nitpicky), MyST's links included.
nitpicky = True
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4
# The heading levels of the generated reports of docs/results/ (a title, then "### iid") are
# their writer's: MyST's remark on a skipped level is not an error there.
suppress_warnings = ["myst.header"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"show-inheritance": True}
autodoc_inherit_docstrings = False  # a Lightning hook's docstring is Lightning's, not ours
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" as fields: the attributes are documented themselves

html_theme = "alabaster"  # Sphinx's own: nothing to fetch, and the fastest to write
html_theme_options = {
    "description": f"Federated semi-supervised learning with labels at the server ({release})",
    "fixed_sidebar": True,
    "sidebar_collapse": True,
    "page_width": "1100px",
}
html_title = f"fedlit {release}"
html_static_path = ["_static"]
html_css_files = ["fedlit.css"]  # code blocks wrap their long lines
html_show_sourcelink = False
# Signatures name types in full (``typing.Any``, not ``~typing.Any``, which a string annotation
# could not carry) and show them short where they link.
autodoc_typehints_format = "fully-qualified"
python_use_unqualified_type_names = True
