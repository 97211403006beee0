"""One process of the multi-process decoding test (tests/test_distributed.py).

    python -m tests.multiprocess_worker PROCESS_ID NUM_PROCESSES PORT OUT_NPZ [DATA MODEL]

Every process builds the same toy pair, joins the runtime, restores the
target from the one-device run's checkpoint straight into a (data, model)
mesh of all processes' devices, runs each case, and saves the sharded target
as a checkpoint of its own (each process its shards); process 0 writes the
gathered tokens. With NUM_PROCESSES = 0 it runs the same cases on one device
without joining anything (the reference) and saves the target's checkpoint.
"""

from __future__ import annotations

import sys

import numpy as np

CASES = (  # (name, method, verifier, temperature, alpha)
    ("token-sampled", "specdecode", "token", 1.0, 0.0),
    ("block-sampled", "specdecode", "block", 1.0, 0.0),
    ("cascade-token-v3", "token-v3", "token", 1.0, 0.3),
)


def toy_pair():
    import jax  # noqa: PLC0415

    import specdec_jax as sj  # noqa: PLC0415

    target = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=64, hidden_size=32,
                                               intermediate_size=64, num_layers=2, num_heads=4,
                                               num_kv_heads=4))
    drafter = sj.DecoderOnlyLM(sj.DecoderConfig(vocab_size=64, hidden_size=16,
                                                intermediate_size=32, num_layers=1, num_heads=2,
                                                num_kv_heads=2))
    # Scaled weights: peaked distributions, so drafts are accepted and rejected.
    target_params = jax.tree_util.tree_map(lambda x: 4 * x,
                                           target.init_params(jax.random.PRNGKey(0)))
    drafter_params = jax.tree_util.tree_map(lambda x: 4 * x,
                                            drafter.init_params(jax.random.PRNGKey(1)))
    prompts = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10], [11, 12], [13], [14, 15, 16], [17]]
    return target, target_params, drafter, drafter_params, prompts


def run_cases(mesh=None, target_params=None) -> dict[str, np.ndarray]:
    """Every case; ``target_params`` (already placed) replace the toy's own."""
    import jax  # noqa: PLC0415

    import specdec_jax as sj  # noqa: PLC0415
    from specdec_jax.runtime import (
        distributed,  # noqa: PLC0415
        sharding,  # noqa: PLC0415
    )

    target, own_target_params, drafter, drafter_params, prompts = toy_pair()
    prompt = sj.make_prompt(prompts)
    if target_params is None:
        target_params = (own_target_params if mesh is None
                         else sharding.shard_params(own_target_params, mesh))
    if mesh is not None:
        drafter_params = sharding.shard_params(drafter_params, mesh)
        prompt = sharding.shard_prompt(prompt, mesh)
    results = {}
    for name, method, verifier, temperature, alpha in CASES:
        fn = distributed.in_step(sj.make_generate_fn(
            target=target, drafter=drafter, method=method, gamma=3, verifier=verifier,
            max_new_tokens=12))
        out = fn(target_params, drafter_params, prompt, jax.random.PRNGKey(7),
                 sj.sampling_params(temperature=temperature, alpha=alpha))
        results[name] = distributed.gather(out.tokens)
        results[name + "/rejections"] = distributed.gather(out.stats.rejections)
    return results


def checkpoints(out: str) -> tuple[str, str]:
    """(written by the one-device run, written by the multi-process run), both
    beside the output file."""
    import os  # noqa: PLC0415

    base = os.path.dirname(os.path.abspath(out))
    return os.path.join(base, "one-device-ckpt"), os.path.join(base, "multiprocess-ckpt")


def main(argv: list[str]) -> int:
    process_id, num_processes, port, out = int(argv[0]), int(argv[1]), argv[2], argv[3]
    from specdec_jax.checkpoints import orbax_io  # noqa: PLC0415

    one_ckpt, multi_ckpt = checkpoints(out)
    if num_processes == 0:
        np.savez(out, **run_cases())
        orbax_io.save_params(one_ckpt, toy_pair()[1])
        return 0
    data, model = (int(argv[4]), int(argv[5])) if len(argv) > 5 else (2, 4)
    from specdec_jax.runtime import (
        distributed,  # noqa: PLC0415
        sharding,  # noqa: PLC0415
    )

    distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id, timeout_s=60)
    import jax  # noqa: PLC0415

    assert jax.process_count() == num_processes
    mesh = sharding.make_mesh(data=data, model=model)
    # The one-device checkpoint, read straight into this mesh's layout: each
    # process reads only its shards (the abstract tree allocates nothing).
    target, *_ = toy_pair()
    layout = sharding.abstract_params(jax.eval_shape(target.init_params, jax.random.PRNGKey(0)),
                                      mesh)
    target_params = orbax_io.restore_params(one_ckpt, layout)
    assert not all(leaf.is_fully_addressable for leaf in jax.tree_util.tree_leaves(target_params))
    results = run_cases(mesh, target_params)
    orbax_io.save_params(multi_ckpt, target_params)  # every process writes its own shards
    if distributed.is_writer():
        np.savez(out, **results, devices=np.int32(jax.device_count()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
