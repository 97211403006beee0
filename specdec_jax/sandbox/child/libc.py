"""ctypes for the kernel layers the harness sets up, and hiding it from the sample.

Runs inside the sandboxed child only (loaded by path by ``harness.py``):
standard library only, no imports from the package.
"""

import os
import sys


def load_libc():
    """(ctypes, call): the ctypes module and ``call``, which runs a libc function."""
    import ctypes  # only where a kernel layer is set up; the sample never gets it (hide_ctypes)
    libc = ctypes.CDLL(None, use_errno=True)

    def call(name, what, *args):
        """libc ``name`` with integer arguments as C longs; OSError when it returns -1."""
        args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
        result = getattr(libc, name)(*args)
        if result == -1:
            number = ctypes.get_errno()
            raise OSError(number, "%s: %s" % (what, os.strerror(number)))
        return result
    return ctypes, call


def hide_ctypes():
    """Forgets the ctypes the harness imported, so the sample's ``import ctypes``
    meets the audit hook's import check again, as it would without the harness."""
    for name in [n for n in sys.modules if n in ("ctypes", "_ctypes") or n.startswith("ctypes.")]:
        del sys.modules[name]

