"""The CLI prints these domain errors as one line; they and the exit codes live in :mod:`cluster.errors`."""

from cluster.errors import ClusterctlError, ExitCode, UsageError

__all__ = ["ClusterctlError", "ExitCode", "UsageError"]
