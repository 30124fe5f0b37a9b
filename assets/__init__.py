"""This deployment's Python assets (the demo job itself is YAML: ``assets/defs/``)."""

from .debian import debian_packages

__all__ = ["debian_packages"]
