"""``python -m fedlit.cli``: the ``fedlit`` command."""

from fedlit.cli import console_main

if __name__ == "__main__":  # not in the pool executor's workers, which import this module
    console_main()
