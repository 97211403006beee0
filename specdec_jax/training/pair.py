"""The project's own T5 drafter/target pair, trained on first use and cached.

No pretrained T5 can be fetched here, so the T5 experiments of seeds 000 and
001 run on a pair trained by the recipes of ``training.recipes``: per task, a
large target and a small drafter fine-tuned from scratch, and the small one
distilled from the large. Members are named ``<pair>-<role>:<task>``, e.g.
``t5-cpu-large:translation_en_de``; ``ensure_member`` trains whatever is
missing (printing what and roughly how long) and ``load_member`` returns
``(model, params, vocabulary)``. Everything lives under
``<cache>/t5/<pair>/<task>/<role>``; delete a folder to retrain it.

    python -m specdec_jax.training.pair t5-cpu translation_en_de   # builds all three
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

from specdec_jax.checkpoints import fetch
from specdec_jax.training import recipes

SUBDIR = "t5"
ROLES = ("large", "small", "small-distilled")


@dataclasses.dataclass(frozen=True)
class PairRecipe:
    sizes: dict  # role -> recipes.T5_SIZES key ("small-distilled" uses "small")
    training: dict  # run_training settings shared by both sizes
    steps: dict  # role -> fine-tuning (or distillation) steps
    distillation: dict  # run_distillation settings
    minutes: dict  # role -> rough minutes on a 2-core CPU (what the user is told)


PAIRS: dict[str, PairRecipe] = {
    "t5-cpu": PairRecipe(
        sizes={"large": "t5-large-cpu", "small": "t5-small-cpu"},
        training=dict(batch_size=32, input_length=128, target_length=128,
                      learning_rate=0.01, schedule="rsqrt", warmup_steps=200,
                      eval_examples=256, eval_every=500, checkpoint_every=250),
        steps={"large": 1500, "small": 4000, "small-distilled": 1000},
        distillation=dict(batch_size=32, input_length=128, target_length=128,
                          train_limit=4096, eval_examples=200, learning_rate=1e-3),
        minutes={"large": 120, "small": 60, "small-distilled": 60}),
    # For tests: trains in seconds, means nothing.
    "t5-test": PairRecipe(
        sizes={"large": "t5-tiny", "small": "t5-tiny"},
        training=dict(batch_size=4, input_length=96, target_length=96, train_limit=16,
                      eval_examples=4, vocab_sources=("libc-de",), vocab_size=400,
                      extra_ids=10, warmup_steps=0),
        steps={"large": 2, "small": 2, "small-distilled": 2},
        distillation=dict(batch_size=4, input_length=96, target_length=96, train_limit=8,
                          eval_examples=4, eval_max_new_tokens=6),
        minutes={"large": 1, "small": 1, "small-distilled": 1}),
}


def parse_member(name: str) -> tuple[str, str, str]:
    """``<pair>-<role>:<task>`` -> (pair, role, task)."""
    head, _, task = name.partition(":")
    for pair in PAIRS:
        for role in ROLES:
            if head == f"{pair}-{role}" and task:
                return pair, role, task
    members = [f"{p}-{r}:<task>" for p in PAIRS for r in ROLES]
    raise ValueError(f"{name!r} is not a member of a T5 pair; use one of {', '.join(members)} "
                     "(task: translation_en_de or summarisation_debian).")


def is_member(name: str) -> bool:
    try:
        parse_member(name)
    except ValueError:
        return False
    return True


def member_dir(pair: str, role: str, task: str) -> pathlib.Path:
    return fetch.cache_dir() / SUBDIR / pair / task / role


def ensure_member(name: str, *, progress: bool = True) -> pathlib.Path:
    """The finished run of a member, trained first (with what it needs) if absent."""
    pair, role, task = parse_member(name)
    recipe = PAIRS[pair]
    workdir = member_dir(pair, role, task)
    if (workdir / "summary.json").exists():
        return workdir
    if role == "small-distilled":
        teacher = ensure_member(f"{pair}-large:{task}", progress=progress)
        student = ensure_member(f"{pair}-small:{task}", progress=progress)
        print(f"{name} is not in the cache: distilling it into {workdir} (about "
              f"{recipe.minutes[role]} minutes on 2 CPU cores; resumable).", file=sys.stderr)
        recipes.run_distillation(workdir=str(workdir), teacher_workdir=str(teacher),
                                 student_workdir=str(student), task=task,
                                 num_steps=recipe.steps[role], progress=progress,
                                 **recipe.distillation)
        return workdir
    print(f"{name} is not in the cache: training it into {workdir} (about "
          f"{recipe.minutes[role]} minutes on 2 CPU cores; resumable).", file=sys.stderr)
    recipes.run_training(workdir=str(workdir), model_size=recipe.sizes[role], objective="task",
                         task=task, num_steps=recipe.steps[role], progress=progress,
                         **recipe.training)
    return workdir


def load_member(name: str, *, progress: bool = True):
    """(model, params, vocabulary) of a pair member, trained on first use."""
    model, params, vocab, _ = recipes.load_run(ensure_member(name, progress=progress))
    return model, params, vocab


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Builds (or finds) a T5 pair's members.")
    parser.add_argument("pair", choices=sorted(PAIRS))
    parser.add_argument("task", choices=["translation_en_de", "summarisation_debian"])
    args = parser.parse_args(argv)
    for role in ROLES:
        print(f"{args.pair}-{role}:{args.task}: "
              f"{ensure_member(f'{args.pair}-{role}:{args.task}')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
