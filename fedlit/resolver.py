"""A recipe and its overrides (``fedlit fit``'s arguments) resolved into its objects, nothing
run (:func:`resolve`): the one door to the fit command's parser
(:class:`~fedlit.cli.fit.FedlitCLI`) for the code that plans and checks runs (the comparison)
and for the commands. The comparison imports this module, never ``fedlit.cli``, so no import
circle runs through the command line."""

from __future__ import annotations

from collections.abc import Sequence

from fedlit.cli.fit import FedlitCLI


def resolve(args: Sequence[str]) -> FedlitCLI:
    """A recipe and its overrides (``fit``'s arguments), parsed and instantiated, not run."""
    return FedlitCLI(args=list(args), run=False)
