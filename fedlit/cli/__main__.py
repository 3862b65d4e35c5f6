"""``python -m fedlit.cli``: the ``fedlit`` command."""

from fedlit.cli import console_main

console_main()
