"""`tomllib` for Python 3.10, where it is not in the standard library yet (the NGC 24.10 images).

The project reads its settings with tomllib, which Python 3.11 took over from tomli unchanged. The server
image installs tomli and this module only where `import tomllib` fails.
"""

from tomli import TOMLDecodeError, load, loads

__all__ = ["TOMLDecodeError", "load", "loads"]
