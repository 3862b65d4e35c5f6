"""``python -m fedlit.cli``: the ``fedlit`` command."""

from fedlit.cli import main

main()
