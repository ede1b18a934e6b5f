"""Exceptions of the cairn package."""


class CairnError(Exception):
    """Base class of every error raised by the cairn package."""


class NotFoundError(CairnError, LookupError):
    """No such run, checkpoint, committed version, rank or region."""


class CorruptionError(CairnError):
    """A file of the store fails a check (checksum, size, format): its data are
    not returned. The message names the file and what failed."""


class NotSupportedError(CairnError):
    """A file of a newer format version than this package reads."""


class DiffUnavailable(CairnError):
    """The cairn CLI was not found or has no `diff` command."""
