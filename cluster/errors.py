"""Domain errors: one clean line for a person, with a chosen exit code (the CLI prints them; 2 = usage/inventory)."""


class ClusterctlError(Exception):
    """An error a person can act on. ``exit_code`` follows the CLI's documented codes (2 = usage/inventory)."""

    exit_code = 1

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(ClusterctlError):
    exit_code = 2
