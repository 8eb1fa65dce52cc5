"""Reading a file that holds a secret (a token, a key, a table of key hashes): it must be readable by its
owner only (mode 0600 or tighter), as ssh refuses a private key others can read, so a secret left readable
to every local account is refused before it is used, with the ``chmod`` that fixes it.
"""

from __future__ import annotations

import stat
from pathlib import Path


class PrivateFileError(ValueError):
    """A secret's file that cannot be used; the message names the file and the problem, never its content."""


def read_private_text(path: str | Path, what: str, holds: str = "",
                      error: type[Exception] = PrivateFileError) -> str:
    """The text of ``path``. ``error`` (one line naming the file) when it cannot be read, is not text, or is
    readable by group or others. ``what`` names the file in the errors ("the Consul token file"); ``holds``,
    when given, says what the secret is ("the Consul ACL token")."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file" + (f" ({what} holds {holds})" if holds else "")) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise error(f"{path}: readable by group/others (mode {stat.S_IMODE(mode):04o}); chmod 600 it"
                    + (f" (it holds {holds})" if holds else ""))
    return text
