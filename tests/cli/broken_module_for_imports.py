"""A module that raises when imported: a class path naming it must be a ConfigError, not a raw RuntimeError."""

raise RuntimeError("this module refuses to be imported")
