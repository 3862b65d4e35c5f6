"""fedlit: federated semi-supervised learning with labels at the server, on Lightning."""

__version__ = "0.1.0"
