"""Training jobs: ``python -m train.main --gin_file=... --gin_bindings=...``
(the same as ``specdec-jax train ...``).

The default job is ``run_training`` (``specdec_jax.training.recipes``): T5
v1.1 pre-training by span corruption or fine-tuning on a task, resumable from
its workdir. Example::

    python -m train.main --gin_file=configs/runs/finetune_t5.gin \\
        --gin_bindings="WORKDIR = 'results/t5-small'" --gin_bindings="run_training.num_steps = 50"
"""

from __future__ import annotations

import sys

from specdec_jax.jobs import launch


def main(argv=None) -> int:
    return launch.main(argv, default_job="run_training", description=__doc__.splitlines()[0])


if __name__ == "__main__":
    sys.exit(main())
