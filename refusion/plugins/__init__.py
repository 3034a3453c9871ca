"""Plugins: the hook specifications, the plugin manager and the name -> class registry.

Plugin authors need only :data:`hookimpl`::

    from refusion.plugins import hookimpl

    @hookimpl
    def register_selectors(register):
        register(MySelector)
"""

from refusion.plugins.manager import hookimpl

__all__ = ["hookimpl"]
