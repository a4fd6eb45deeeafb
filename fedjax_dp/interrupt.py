"""Ctrl-C between rounds: the host loop's SIGINT handling.

Within :func:`interruptible`, SIGINT only sets a flag; the group loop
(:func:`fedjax_dp.groups.run_group`) reads it between rounds (:func:`requested`),
checkpoints its runs, writes their directories with status ``'interrupted'`` and
raises ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import signal
import threading


class _SigintState:
  requested = False


_SIGINT = _SigintState()


@contextlib.contextmanager
def interruptible():
  """Within this context, SIGINT (Ctrl-C) asks :func:`fedjax_dp.groups.run_group` to stop after the
  current round instead of raising at once: it checkpoints its runs, writes their
  directories with status ``'interrupted'`` and raises ``KeyboardInterrupt``. A
  second SIGINT raises at once. Outside the main thread, or where SIGINT is ignored
  (a background job), this does nothing."""
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
    yield
    return

  def handler(signum, frame):
    if _SIGINT.requested:
      raise KeyboardInterrupt
    _SIGINT.requested = True

  previous = signal.signal(signal.SIGINT, handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
    _SIGINT.requested = False


def requested() -> bool:
  """Whether a SIGINT arrived within :func:`interruptible` (the loop stops now)."""
  return _SIGINT.requested
