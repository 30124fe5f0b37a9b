"""This deployment's jobs, declared with sparkbatch_dagster."""

from .debian import debian_job, debian_packages

__all__ = ["debian_job", "debian_packages"]
