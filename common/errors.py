"""Domain errors: one clean line for a person, with a chosen exit code (the CLI prints them), and the codes.

:class:`ExitCode` is the one spelling of every exit status ``clusterctl`` documents; scripts and CI gate
on them, so a value never changes meaning.
"""

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # a check failed, a host failed provisioning, a regression: a verdict, not a crash
    USAGE = 2  # bad arguments, inventory or profile: nothing was contacted
    UNREACHABLE = 3  # a host or service could not be reached, or a check could not run (and none failed)
    # sysexits.h EX_SOFTWARE: a bug in clusterctl; distinct from every verdict above
    INTERNAL = 70
    INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT (128 + 2)


class ClusterctlError(Exception):
    """An error a person can act on, printed as one line; ``exit_code`` is one of :class:`ExitCode`."""

    exit_code: int = ExitCode.FAILED

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = ExitCode(exit_code)


class UsageError(ClusterctlError):
    exit_code = ExitCode.USAGE
