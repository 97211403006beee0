"""What runs inside the sandboxed child: ``harness.py``, run by path, and the modules it loads.

Standard library only, and no ``import`` between these modules: the child runs
``python -I``, without the package on its path (``harness.load_sibling``).
"""
