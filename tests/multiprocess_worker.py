"""One process of the multi-process decoding test (tests/test_distributed.py).

    python -m tests.multiprocess_worker PROCESS_ID NUM_PROCESSES PORT OUT_NPZ [DATA MODEL]

Every process builds the same toy pair, joins the runtime, shards the target
over a (data, model) mesh of all processes' devices and runs each case;
process 0 writes the gathered tokens. With NUM_PROCESSES = 0 it runs the
same cases on one device without joining anything (the reference).
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


def run_cases(mesh=None) -> dict[str, np.ndarray]:
    import jax  # noqa: PLC0415

    import specdec_jax as sj  # noqa: PLC0415
    from specdec_jax import distributed, sharding  # noqa: PLC0415

    target, target_params, drafter, drafter_params, prompts = toy_pair()
    prompt = sj.make_prompt(prompts)
    if mesh is not None:
        target_params = sharding.shard_params(target_params, mesh)
        drafter_params = sharding.shard_params(drafter_params, mesh)
        prompt = sharding.shard_prompt(prompt, mesh)
    results = {}
    for name, method, verifier, temperature, alpha in CASES:
        fn = sj.make_generate_fn(target=target, drafter=drafter, method=method, gamma=3,
                                 verifier=verifier, max_new_tokens=12)
        out = fn(target_params, drafter_params, prompt, jax.random.PRNGKey(7),
                 sj.sampling_params(temperature=temperature, alpha=alpha))
        results[name] = distributed.gather(out.tokens)
        results[name + "/rejections"] = distributed.gather(out.stats.rejections)
    return results


def main(argv: list[str]) -> int:
    process_id, num_processes, port, out = int(argv[0]), int(argv[1]), argv[2], argv[3]
    if num_processes == 0:
        np.savez(out, **run_cases())
        return 0
    data, model = (int(argv[4]), int(argv[5])) if len(argv) > 5 else (2, 4)
    from specdec_jax import distributed, sharding  # noqa: PLC0415

    distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id, timeout_s=60)
    import jax  # noqa: PLC0415

    assert jax.process_count() == num_processes
    mesh = sharding.make_mesh(data=data, model=model)
    results = run_cases(mesh)
    if distributed.is_writer():
        np.savez(out, **results, devices=np.int32(jax.device_count()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
