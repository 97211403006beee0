"""kill -9 demonstration for the feature-head training job (toy target).

Usage: python demo.py data | train WORKDIR | compare A B
"""
import json, sys
from specdec_jax.checkpoints import resolver
from specdec_jax.jobs.feature_head import run_feature_head_data
from specdec_jax.training.feature_head.train import train_feature_head

TARGET = "toy-bytes-large"
DATA = "/work/kill9/data"
cmd = sys.argv[1]
if cmd == "data":
    run_feature_head_data(target=TARGET, out_dir=DATA, max_positions=1536, length=64,
                          num_prompts=4, max_new_tokens=16, generation_batch_size=4,
                          batch_size=4, shard_sequences=8, progress=False)
elif cmd == "train":
    model, params, _ = resolver.resolve(TARGET)
    train_feature_head(workdir=sys.argv[2], data_dir=DATA, target_name=TARGET, target=model,
                       target_params=params, learning_rate=3e-3, warmup_steps=2,
                       num_steps=40, batch_size=4, checkpoint_every=5, eval_every=1000,
                       progress=False)
elif cmd == "compare":
    def losses(path):
        out = {}
        for line in open(path):
            row = json.loads(line)
            if "loss" in row:
                out.setdefault(row["step"], []).append(row["loss"])
        return out
    a, b = losses(sys.argv[2] + "/metrics.jsonl"), losses(sys.argv[3] + "/metrics.jsonl")
    redone = sorted(s for s, v in b.items() if len(v) > 1)
    same = all(a[s][-1] == b[s][-1] for s in a) and sorted(a) == sorted(b)
    print(f"steps {len(a)}; steps written twice in the killed run (redone after resume): "
          f"{redone}; every step's loss identical to the uninterrupted run: {same}")
    for s in redone:
        print(f"  step {s}: before kill {b[s][0]!r}, after resume {b[s][-1]!r}, uninterrupted {a[s][-1]!r}")
