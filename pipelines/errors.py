"""The error a command raises for a flag or argument it cannot use.

``stitchrec`` (``pipelines.cli``) prints a user error as one ``error:`` line and exits with
status 2; any other exception is a bug and propagates with its traceback.
"""

from __future__ import annotations


class UsageError(ValueError):
    """A command-line flag or argument that cannot be used; names the flag, the value given and
    what was expected."""
