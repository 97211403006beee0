"""Progress bars that behave in logs as well as in terminals.

On a terminal this is plain ``tqdm``. When the output is not a terminal (a
``nohup`` log, CI, a notebook's captured stream), tqdm's carriage-return
redraws pile up into one unreadable line of hundreds of updates; here each
update is a whole line instead, at most one per ``LOG_INTERVAL_S`` seconds,
plus the final one. ``SPECDEC_JAX_PROGRESS=0`` turns bars off everywhere.

    from specdec_jax.runtime.progress import tqdm
    for batch in tqdm(batches, desc="teacher samples", unit="batch"):
        ...
"""

from __future__ import annotations

import os
import sys

from tqdm import tqdm as _terminal_tqdm

LOG_INTERVAL_S = 30.0
ENV = "SPECDEC_JAX_PROGRESS"


class _LineTqdm(_terminal_tqdm):
    """One full line per update (no carriage returns), rate-limited."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("mininterval", LOG_INTERVAL_S)
        kwargs.setdefault("maxinterval", LOG_INTERVAL_S * 4)
        kwargs["dynamic_ncols"] = False
        kwargs["ncols"] = 100
        super().__init__(*args, **kwargs)

    # tqdm redraws on every postfix change by default; in a log that is a line per
    # training step. The postfix shows on the next rate-limited line instead.
    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        del refresh
        super().set_postfix(ordered_dict, refresh=False, **kwargs)

    def set_postfix_str(self, s="", refresh=True):
        del refresh
        super().set_postfix_str(s, refresh=False)

    def display(self, msg=None, pos=None):
        del pos
        line = (self.__str__() if msg is None else msg).strip()
        if line:
            self.fp.write(line + "\n")
            self.fp.flush()
        return True


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def tqdm(*args, **kwargs):
    """``tqdm(...)`` with the same arguments; see the module docstring."""
    if os.environ.get(ENV, "1") == "0":
        kwargs["disable"] = True
    stream = kwargs.get("file") or sys.stderr
    cls = _terminal_tqdm if _is_terminal(stream) else _LineTqdm
    if cls is _LineTqdm:
        kwargs.pop("leave", None)  # a finished line in a log is worth keeping
    return cls(*args, **kwargs)
