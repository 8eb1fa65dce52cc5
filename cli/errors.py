"""The CLI prints these domain errors as one line; they live in :mod:`cluster.errors` with the libraries."""

from cluster.errors import ClusterctlError, UsageError

__all__ = ["ClusterctlError", "UsageError"]
