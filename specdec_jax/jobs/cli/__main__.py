"""``python -m specdec_jax.jobs.cli``: the ``specdec-jax`` command."""

import sys

from specdec_jax.jobs.cli.main import main

sys.exit(main())
