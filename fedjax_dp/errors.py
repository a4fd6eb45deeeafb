"""Errors caused by what the user gave (a config value, a file, an option).

The command line turns these -- and only these -- into one line on stderr
(``fedjax-dp: error: <field or file>: <message>``) and exit status 2. Any other
exception is an internal error and keeps its traceback.
"""

from __future__ import annotations


class UserError(ValueError):
  """Bad input from the user; the message names the field or file and the value."""


class ConfigError(UserError):
  """A config field has a bad value; the message names the field."""
