"""Every exception refusion raises, all under :class:`RefusionError`.

Every error a user can cause is a :class:`ConfigError` whose message names the
parameter (in backticks), the value it got and what is allowed; a batch row's
is a :class:`RowError` (it also names the row), an HTTP request's an
:class:`APIError` (it also carries the status the server answers with). Every
error a plugin causes is a :class:`PluginError` naming the plugin.
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
from collections.abc import Iterable, Mapping
from typing import Any


class RefusionError(Exception):
    """Base class of every error raised by refusion."""


class ConfigError(RefusionError, ValueError):
    """Bad input: a parameter is out of range or parameters do not fit together.

    ``param`` names the parameter (or field) at fault when one is, so that a
    caller can point at it (the server reports it as the request field).
    """

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.param = param

    def __reduce__(self):  # keep ``param`` across pickling (errors cross process boundaries)
        return (_config_error, (type(self), str(self), self.param))


def _config_error(cls: type, message: str, param: str | None) -> ConfigError:
    error = cls(message)
    error.param = param
    return error


class UnknownNameError(ConfigError, LookupError):
    """A strategy, preset or model-adapter name that is not registered."""


class QueueFull(RefusionError):
    """A :class:`~refusion.batcher.Batcher`'s queue holds ``max_queue`` requests already: retry later."""


class CallbackError(RefusionError):
    """A request's ``on_event`` callback raised: that request fails with this error (the cause chained), others go
    on."""


class StalledError(RefusionError):
    """A request can make no more progress (nothing of it is queued or decoding); raised instead of waiting forever."""


class PluginError(RefusionError):
    """A plugin (a registered part) misbehaved: it raised or returned malformed data.

    ``plugin`` is the part's registry name and ``source`` the package that
    provided it, so the message points at the code to fix.
    """

    def __init__(self, message: str, *, plugin: str | None = None, source: str | None = None):
        super().__init__(message)
        self.plugin = plugin
        self.source = source


class UsageError(ConfigError):
    """A command line the ``refusion`` command cannot parse (an unknown flag, a value of the wrong type or out of
    range); the message names the flag as argparse does (``argument --port: ...``)."""


class RegistrationError(PluginError):
    """A plugin tried to register a class that is not a valid part, or a name that is taken."""


class RowError(ConfigError):
    """A batch row that cannot be run: ``param`` names its field, ``row_id`` the row's own ``id`` (``None`` when it
    has no readable one) and ``line`` its line in the input (counted from 1)."""

    def __init__(self, message: str, *, param: str | None = None, row_id: str | None = None, line: int | None = None):
        super().__init__(message, param=param)
        self.row_id = row_id
        self.line = line

    def __reduce__(self):  # keep ``param``, ``row_id`` and ``line`` across processes (Ray workers)
        return (_row_error, (str(self), self.param, self.row_id, self.line))


def _row_error(message: str, param: str | None, row_id: str | None, line: int | None) -> RowError:
    return RowError(message, param=param, row_id=row_id, line=line)


class ImportRefused(ConfigError):
    """A ``"module:Class"`` name in input that may not run code (a checkpoint's ``refusion.json``, a request, a
    batch row, a record), refused before anything was imported; ``param`` names the field
    (:mod:`refusion.config.trust`)."""


class InvalidJSON(ConfigError):
    """A request body that is not one JSON object (the message says why; ``param`` names the field when one is at
    fault, e.g. a ``NaN`` in ``temperature``)."""


class BodyTooLarge(RefusionError):
    """A request body passed the server's limit while it was read (the server answers 413)."""


class APIError(RefusionError):
    """An error the HTTP server answers with: the HTTP ``status``, OpenAI's error ``type``, the request field at
    fault (``param``), a machine-readable ``code`` and extra response ``headers`` (``Retry-After``)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers

    def __repr__(self) -> str:
        return f"APIError({self.status}, {self.message!r}, param={self.param!r}, code={self.code!r})"

    def body(self) -> dict[str, Any]:
        """OpenAI's error body; text echoed from the request that is not valid Unicode is escaped, never a 500."""
        return {
            "error": {
                "message": _printable(self.message),
                "type": self.type,
                "param": _printable(self.param),
                "code": self.code,
            }
        }


def _printable(text: str | None) -> str | None:
    return None if text is None else text.encode("utf-8", "backslashreplace").decode("utf-8")


class RefusionWarning(UserWarning):
    """Something refusion did for the user that they did not ask for (e.g. a default length fitted to the model)."""


#: the directory of refusion's own modules: frames there are not a warning's caller
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_caller(message: str, category: type[Warning] = RefusionWarning) -> None:
    """Warn with ``message``, attributed to the first frame outside refusion's package (the user's line that
    called into refusion, however deep the call went: ``run_batch`` -> worker -> ``fit_default_length``).

    When every frame is refusion's own (``python -m refusion.cli``), the warning points at the outermost one.
    """
    frame = sys._getframe(1)
    level = 2  # warnings.warn's stacklevel of warn_caller's caller
    while frame.f_back is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)


def bad_value(param: str, value: Any, allowed: str) -> ConfigError:
    """Return a :class:`ConfigError` for ``param`` in the house style.

    >>> str(bad_value("slot_size", 0, "an integer >= 1"))
    '`slot_size` must be an integer >= 1; got 0.'
    """
    try:
        got = repr(value)
    except ValueError:  # an int too long to print
        got = f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    return ConfigError(f"`{param}` must be {allowed}; got {got:.200}.", param=param)


def unknown_name(kind: str, name: str, known: Iterable[str]) -> UnknownNameError:
    """Return an :class:`UnknownNameError` listing the known names of ``kind``."""
    names = ", ".join(sorted(known)) or "(none registered)"
    return UnknownNameError(f"Unknown {kind} {name!r}. Known {kind}s: {names}.", param=kind.replace(" ", "_"))


def renamed(error: ConfigError, names: Mapping[str, str]) -> ConfigError:
    """A copy of ``error`` (same class) naming its parameter as the caller's user knows it: ``param`` and each
    ```name``` in the message replaced by ``names[name]`` (a server's ``max_tokens`` for the decoder's ``gen_length``).
    """
    message = str(error)
    for old, new in names.items():
        message = message.replace(f"`{old}`", f"`{new}`")
    out = copy.copy(error)
    out.args = (message,)
    out.param = names.get(error.param, error.param) if error.param is not None else None
    return out
