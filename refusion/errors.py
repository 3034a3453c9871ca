"""Exceptions raised by refusion.

Every error a user can cause is a :class:`ConfigError` whose message names the
parameter (in backticks), the value it got and what is allowed. Every error a
plugin causes is a :class:`PluginError` naming the plugin.
"""

from __future__ import annotations

from typing import Any, Iterable


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


def _config_error(cls: type, message: str, param: str | None) -> "ConfigError":
    error = cls(message)
    error.param = param
    return error


class UnknownNameError(ConfigError, LookupError):
    """A strategy, preset or model-adapter name that is not registered."""


class QueueFull(RefusionError):
    """A :class:`~refusion.generator.Generator`'s queue holds ``max_queue`` requests already: retry later."""


class CallbackError(RefusionError):
    """A request's ``on_event`` callback raised: that request fails with this error (the cause chained), others go on."""


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


class RefusionWarning(UserWarning):
    """Something refusion did for the user that they did not ask for (e.g. a default length fitted to the model)."""


def bad_value(param: str, value: Any, allowed: str) -> ConfigError:
    """Return a :class:`ConfigError` for ``param`` in the house style.

    >>> str(bad_value("slot_size", 0, "an integer >= 1"))
    '`slot_size` must be an integer >= 1; got 0.'
    """
    return ConfigError(f"`{param}` must be {allowed}; got {value!r}.", param=param)


def unknown_name(kind: str, name: str, known: Iterable[str]) -> UnknownNameError:
    """Return an :class:`UnknownNameError` listing the known names of ``kind``."""
    names = ", ".join(sorted(known)) or "(none registered)"
    return UnknownNameError(f"Unknown {kind} {name!r}. Known {kind}s: {names}.", param=kind.replace(" ", "_"))
