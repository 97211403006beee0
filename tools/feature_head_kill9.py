"""The kill -9 check of the feature-head training job, on the toy target.

    python tools/feature_head_kill9.py data              # toy features into results/kill9/data
    python tools/feature_head_kill9.py train results/kill9/a    # uninterrupted: 40 steps
    python tools/feature_head_kill9.py train results/kill9/b &  # kill -9 it mid-run, then
    python tools/feature_head_kill9.py train results/kill9/b    # ... run it again to the end
    python tools/feature_head_kill9.py compare results/kill9/a results/kill9/b

Checkpoints are written every 5 steps, so a run killed between them redoes
the steps after its newest complete checkpoint; ``compare`` says whether every
step's loss equals the uninterrupted run's.
"""

import json
import sys

from specdec_jax.jobs import resolver
from specdec_jax.jobs.feature_head import run_feature_head_data
from specdec_jax.training.feature_head.train import train_feature_head

TARGET = "toy-bytes-large"
DATA = "results/kill9/data"


def losses(workdir: str) -> dict[int, float]:
    """step -> loss of a run's metrics.jsonl (a resumed run keeps one row a step)."""
    rows = (json.loads(line) for line in open(f"{workdir}/metrics.jsonl"))
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


def main(argv: list[str]) -> None:
    command = argv[0] if argv else ""
    if command == "data":
        run_feature_head_data(target=TARGET, out_dir=DATA, max_positions=1536, length=64,
                              num_prompts=4, max_new_tokens=16, generation_batch_size=4,
                              batch_size=4, shard_sequences=8, progress=False)
    elif command == "train" and len(argv) == 2:
        model, params, _ = resolver.resolve(TARGET)
        train_feature_head(workdir=argv[1], data_dir=DATA, target_name=TARGET, target=model,
                           target_params=params, learning_rate=3e-3, warmup_steps=2,
                           num_steps=40, batch_size=4, checkpoint_every=5, eval_every=1000,
                           progress=False)
    elif command == "compare" and len(argv) == 3:
        a, b = losses(argv[1]), losses(argv[2])
        print(f"{len(a)} steps; every step's loss identical to the uninterrupted run's: "
              f"{a == b}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
