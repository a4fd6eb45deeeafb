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


def unreadable(error: BaseException) -> str:
  """Why a file of the project's kind (JSON, CSV, a checkpoint) could not be read, in
  the project's words: a library's message is not passed through to the user."""
  import json  # pylint: disable=import-outside-toplevel
  if isinstance(error, json.JSONDecodeError):
    return f"not valid JSON at line {error.lineno}, column {error.colno}"
  if isinstance(error, UnicodeDecodeError):
    return "not UTF-8 text"
  if isinstance(error, KeyError):
    return f"no field {error.args[0]!r}" if error.args else "a field is missing"
  if isinstance(error, OSError):
    return error.strerror or "cannot be read"
  return "its content is not in the expected form"
