"""Decoding speed on an accelerator (or the CPU), in-loop, at explicit acceptance regimes.

Runs where the real weights are not at hand: ``--random-weights`` builds the
registered architectures' exact shapes (``registry.ARCHITECTURES``) with random
weights, since a step's cost depends on shapes and dtype, not on values. For
each dtype, in one process:

1. **Device limits**: read, copy and matmul rates (``timing.device_limits``).
2. **In-loop steps**: each model's ``extend`` of K tokens (K = 1 and every
   G + 1) at each batch size, timed as 32 steps inside one jitted loop (a
   host-dispatched call would add its dispatch, which the decoding loop never
   pays), with the effective bandwidth ``weight bytes / step`` against the
   measured copy rate (the reference on a GPU) and read rate (the reference
   on CPU, where writing a fresh 1 GiB output page-faults and the copy
   measures far below what a step can read).
3. **Decoding**: the autoregressive target and ``specdecode`` / ``token-v3``
   at each G, greedy, in two regimes made explicit by the drafter:
   *all-accept* (the drafter is the target itself: every draft is accepted)
   and *none-accepted* (the real drafter's shapes with independent random
   weights: greedy drafts essentially never match). Decode time excludes
   both prefills (timed alone and subtracted). Per run: tokens/s, round time,
   **round overhead = round / (drafter calls per round x drafter step +
   target step of G + 1 tokens) - 1** (in-loop steps), compile time, measured
   acceptance; and a check that nothing recompiles across prompts and
   sampling settings (backend compile events counted, must be 0 after the
   first call).
4. **Predicted tokens/s** of the real pair at acceptance rates measured on
   CPU with the real weights (``--acceptance``): i.i.d. acceptance ``a`` gives
   ``(1 - a^(G+1)) / (1 - a)`` tokens per round, at the measured round time
   of the none-accepted regime (the real drafter's shapes).
5. **Peers** (batch 1, same weights): ``transformers`` eager and with a static
   cache + ``torch.compile`` (its own ``generate`` path, the fair peer), AR and
   assisted generation (eager: ``transformers`` refuses assisted generation
   with a static cache) in both regimes; greedy outputs compared token for
   token with ours (float32).

    # GPU (bf16 is the accelerator default):
    python eval/bench_accelerator.py --random-weights --dtypes bfloat16 float32 \\
        --batch-sizes 1 8 --gammas 3 5 7
    # CPU (the README's figures; 2 cores take ~15 min):
    python eval/bench_accelerator.py --random-weights --dtypes float32 --batch-sizes 1 \\
        --gammas 5 --max-new-tokens 32 --steps 8 --repeats 3

Writes a JSON report after every section (``--out``) and a Markdown summary.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
import warnings

import jax
import numpy as np

from specdec_jax import api, precision
from specdec_jax.checkpoints import load
from specdec_jax.models.decoder import DecoderOnlyLM, with_kernel_layout
from specdec_jax.models.interface import make_prompt
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm

REGIMES = ("all-accept", "none-accepted")
SPECULATIVE = ("specdecode", "token-v3")
# Acceptance per draft of the real pair measured on CPU with the real weights
# (README, bench_speculative, HumanEval, G = 5: mean accepted 3.62 of 5 greedy
# and 3.43 at T = 1, i.e. a = 0.87 and 0.84 under i.i.d. acceptance).
MEASURED_ACCEPTANCE = (0.87, 0.84)
TOKEN_V3_ALPHA = 0.3
PEERS = ("eager", "compiled", "assisted")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--drafter", default="qwen2.5-coder-0.5b")
    p.add_argument("--random-weights", action="store_true",
                   help="random weights of the models' exact shapes (no download)")
    p.add_argument("--dtypes", nargs="+", default=["auto"],
                   help="auto (float32 on CPU, bfloat16 on accelerators), float32, bfloat16")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--gammas", type=int, nargs="+", default=[3, 5, 7])
    p.add_argument("--methods", nargs="+", default=list(SPECULATIVE), choices=SPECULATIVE)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=32, help="steps per in-loop timing")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed repeats (in-loop) and prompts (decoding)")
    p.add_argument("--kernel-layout", default="out_in", choices=["out_in", "in_out"],
                   help="dense kernels while decoding: out_in (sj.decode_layout, the "
                        "library's way) or in_out (the checkpoint tree)")
    p.add_argument("--matmul-kernel", default="xla", choices=["xla", "pallas"],
                   help="few-row products of out_in kernels: XLA's dot or the Pallas "
                        "program of specdec_jax.kernels (Triton on GPUs)")
    p.add_argument("--target-step-widths", type=int, nargs="*", default=[],
                   help="more widths K for the target's in-loop step table (decoding runs "
                        "only at --gammas): SpecDec++'s compiled target widths, say, whose "
                        "costs eval/bench_specdecpp.py --device-steps turns into tokens/s")
    p.add_argument("--acceptance", type=float, nargs="+", default=list(MEASURED_ACCEPTANCE))
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS,
                   help="transformers variants to time (none: skip the peer)")
    p.add_argument("--out", default="results/bench_accelerator.json")
    p.add_argument("--markdown", default=None)
    args = p.parse_args(argv)
    if min(args.gammas) < 1 or min(args.batch_sizes) < 1 or min(args.target_step_widths,
                                                                 default=1) < 1:
        p.error("--gammas, --batch-sizes and --target-step-widths must be >= 1.")
    if args.prompt_len < 2 or args.max_new_tokens < 1:
        p.error("--prompt-len must be >= 2 and --max-new-tokens >= 1.")
    if not all(0 <= a < 1 for a in args.acceptance):
        p.error("--acceptance rates must lie in [0, 1).")
    if args.matmul_kernel == "pallas" and args.kernel_layout != "out_in":
        p.error("--matmul-kernel pallas multiplies out_in kernels; use --kernel-layout out_in.")
    args.dtypes = [precision.resolve_dtype(d) for d in args.dtypes]
    return args


def build_models(args, dtype: str) -> dict:
    """name -> (model, params): the target and the drafter (independent weights),
    in ``--kernel-layout`` with ``--matmul-kernel``."""
    models = {}
    for role, name, seed in (("target", args.target, 0), ("drafter", args.drafter, 1)):
        model, params = (load.random_model(name, dtype, seed=seed) if args.random_weights
                         else load.load_model(name, dtype)[:2])
        model, params = with_kernel_layout(model, params, args.kernel_layout)
        config = dataclasses.replace(model.config, matmul_kernel=args.matmul_kernel)
        models[role] = (DecoderOnlyLM(config), params)
    return models


def weight_bytes(params) -> int:
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(params))


def random_prompts(vocab_size: int, batch: int, length: int, count: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [make_prompt(rng.integers(0, vocab_size, (batch, length)).tolist())
            for _ in range(count)]


# -- in-loop steps -------------------------------------------------------------------------

def measure_steps(models: dict, args, limits: dict) -> dict:
    """role -> batch -> K -> step figures."""
    ks = {1} | {g + 1 for g in args.gammas}
    jobs = [(role, b, k) for role in models for b in args.batch_sizes
            for k in sorted(ks | (set(args.target_step_widths) if role == "target" else set()))]
    steps: dict = {}
    for role, batch, k in tqdm(jobs, desc="in-loop steps"):
        model, params = models[role]
        timed = timing.in_loop_step(model, params, k, batch, fill=args.prompt_len,
                                    steps=args.steps, repeats=args.repeats)
        gb_s = weight_bytes(params) / timed.median_s / 1e9
        steps.setdefault(role, {}).setdefault(str(batch), {})[str(k)] = {
            "step_s": timed.median_s, "compile_s": timed.compile_s,
            "weight_gb_s": gb_s, "of_copy_bandwidth": gb_s / limits["copy_gb_s"],
            "of_read_rate": gb_s / limits["read_gb_s"]}
    return steps


# -- decoding ------------------------------------------------------------------------------

@contextlib.contextmanager
def count_compiles():
    """Counts XLA backend compilations inside the block."""
    count = [0]

    def listener(event, duration_secs, **kwargs):
        del duration_secs, kwargs
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield count
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def decode_configs(args) -> list[dict]:
    configs = [{"name": "autoregressive", "method": "autoregressive", "gamma": 0,
                "regime": None}]
    configs += [{"name": f"{m} G={g} {r}", "method": m, "gamma": g, "regime": r}
                for m in args.methods for g in args.gammas for r in REGIMES]
    return configs


def prefill_fns(models: dict, args) -> dict:
    """role -> jitted prefill at the decoders' cache length (one program per
    model and prompt shape, shared by every configuration)."""
    max_length = args.prompt_len + args.max_new_tokens + max(args.gammas) + 2
    return {role: timing.prefill_fn(model, max_length) for role, (model, _) in models.items()}


def run_decode(config: dict, models: dict, args, batch: int, steps: dict,
               prefill_by_role: dict) -> dict:
    """Times one configuration over ``args.repeats`` prompts, prefills subtracted."""
    target, target_params = models["target"]
    drafter_role = "target" if config["regime"] == "all-accept" else "drafter"
    drafter, drafter_params = models[drafter_role]
    fn = api.make_generate_fn(target=target, drafter=drafter, method=config["method"],
                              gamma=max(config["gamma"], 1),
                              max_new_tokens=args.max_new_tokens)
    prompts = random_prompts(target.vocab_size, batch, args.prompt_len, args.repeats + 1,
                             seed=batch)
    alpha = TOKEN_V3_ALPHA if config["method"] == "token-v3" else 0.0
    greedy = api.sampling_params(temperature=0.0, alpha=alpha)
    with count_compiles() as compiles:
        start = time.perf_counter()
        jax.block_until_ready(fn(target_params, drafter_params, prompts[0],
                                 jax.random.PRNGKey(0), greedy))
        first_call_s = time.perf_counter() - start
        compiled = compiles[0]
        roles = ["target"] + ([drafter_role] if config["gamma"] else [])
        prefills = [(prefill_by_role[role], models[role][1]) for role in roles]
        for fn_p, p in prefills:
            jax.block_until_ready(fn_p(p, prompts[0]))
        before = compiles[0]
        runs = []
        for i, prompt in enumerate(prompts[1:]):
            prefill_s = sum(timing.seconds(fn_p, p, prompt)[0] for fn_p, p in prefills)
            total_s, out = timing.seconds(fn, target_params, drafter_params, prompt,
                                          jax.random.PRNGKey(i + 1), greedy)
            runs.append({"decode_s": total_s - prefill_s, "prefill_s": prefill_s,
                         "tokens": int(np.asarray(out.lengths).sum()),
                         "rounds": int(np.asarray(out.stats.target_calls).max()),
                         "drafter_calls": int(np.asarray(out.stats.drafter_calls).max()),
                         # numpy, not stats.accepted(): an eager jnp op would compile
                         # a small program of its own and blur the recompile count
                         "accepted": int((np.asarray(out.stats.accepted_histogram) * np.arange(
                             out.stats.accepted_histogram.shape[-1])).sum()),
                         "drafted": int(np.asarray(out.stats.drafted).sum()),
                         "nan_logits": int(np.asarray(out.stats.nan_logits).sum())})
        # Other sampling settings (traced) and keys on a seen prompt: no new program.
        for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
            sp = api.sampling_params(temperature=temperature, top_p=top_p, alpha=alpha)
            jax.block_until_ready(fn(target_params, drafter_params, prompts[1],
                                     jax.random.PRNGKey(99), sp))
        recompiles = compiles[0] - before
    decode_s = sum(r["decode_s"] for r in runs)
    tokens = sum(r["tokens"] for r in runs)
    rounds = sum(r["rounds"] for r in runs)
    row = {"batch": batch, **config, "compiled_programs_first_call": compiled,
           "first_call_s": first_call_s, "recompiles_after_first_call": recompiles,
           "jit_cache_entries": fn._cache_size(),  # one program for every call above
           "decode_tokens_per_s": tokens / decode_s, "round_s": decode_s / rounds,
           "tokens_per_round": tokens / rounds / batch,
           "nan_logits": sum(r["nan_logits"] for r in runs), "runs": runs}
    b = str(batch)
    calls_per_round = sum(r["drafter_calls"] for r in runs) / rounds  # 0 when autoregressive
    if config["gamma"]:
        drafted = sum(r["drafted"] for r in runs)
        row.update(acceptance=sum(r["accepted"] for r in runs) / max(drafted, 1),
                   drafter_calls_per_round=calls_per_round)
    row["round_overhead"] = timing.round_overhead(
        row["round_s"], calls_per_round, steps[drafter_role][b]["1"]["step_s"],
        steps["target"][b][str(config["gamma"] + 1)]["step_s"])
    return row


def predict(rows: list[dict], acceptance: list[float]) -> list[dict]:
    """Tokens/s of the real pair at CPU-measured acceptance, from measured rounds."""
    predicted = []
    for row in rows:
        if row["regime"] != "none-accepted":
            continue
        ar = next(r for r in rows if r["batch"] == row["batch"] and not r["gamma"])
        for a in acceptance:
            per_round = (1 - a ** (row["gamma"] + 1)) / (1 - a)
            tps = row["batch"] * per_round / row["round_s"]
            predicted.append({"batch": row["batch"], "method": row["method"],
                              "gamma": row["gamma"], "acceptance": a,
                              "tokens_per_round": per_round, "tokens_per_s": tps,
                              "speedup_vs_autoregressive": tps / ar["decode_tokens_per_s"]})
    return predicted


# -- peers ---------------------------------------------------------------------------------

def hf_model(model, params, dtype: str):
    """A ``transformers`` model holding exactly our weights."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    from specdec_jax.checkpoints.hf_decoder import (  # noqa: PLC0415
        decoder_config_to_hf,
        decoder_params_to_hf,
    )

    hf = decoder_config_to_hf(model.config)
    torch_dtype = getattr(torch, dtype)
    config = transformers.AutoConfig.for_model(**{k: v for k, v in hf.items()
                                                  if k != "architectures"})
    net = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    with warnings.catch_warnings():
        # Read-only views of our buffers: load_state_dict copies them, never writes.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        state = {k: torch.from_numpy(v) for k, v in
                 decoder_params_to_hf(params, model.config).items()}
        missing, unexpected = net.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"peer weights do not match: missing {missing}, unexpected "
                         f"{unexpected}")
    net.tie_weights()
    return net.to(device="cuda" if torch.cuda.is_available() else "cpu",
                  dtype=torch_dtype).eval()


def run_peers(models: dict, args, dtype: str, ours_greedy: list[list[int]]) -> dict:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from transformers import CompileConfig  # noqa: PLC0415

    target = hf_model(*models["target"], dtype)
    drafter = hf_model(*models["drafter"], dtype)
    device = target.device
    prompts = [torch.tensor(p.tokens.tolist(), device=device)
               for p in random_prompts(models["target"][0].vocab_size, 1, args.prompt_len,
                                       args.repeats + 1, seed=1)]
    gamma = args.gammas[len(args.gammas) // 2]
    for assistant in (target, drafter):
        assistant.generation_config.num_assistant_tokens = gamma
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
    compile_config = CompileConfig()
    compile_config._compile_all_devices = True  # its switch to compile on CPU too
    variants = {}
    if "eager" in args.peers:
        variants["eager autoregressive"] = {}
    if "assisted" in args.peers:
        variants[f"eager assisted G={gamma} all-accept"] = {"assistant_model": target}
        variants[f"eager assisted G={gamma} none-accepted"] = {"assistant_model": drafter}
    # Last: compiling leaves a compiled forward on the model. On the H200 run the
    # eager assisted variants, timed after it, did not finish in ~170 s (3 prompts
    # x 128 tokens; eager decoding took 2.4 s a prompt); recompiling at every new
    # shape is the suspect, not confirmed. Timed last, it cannot slow the others.
    if "compiled" in args.peers:
        variants["static cache + torch.compile autoregressive"] = {
            "cache_implementation": "static", "compile_config": compile_config}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results = {"transformers": transformers.__version__, "torch": torch.__version__,
               "gamma": gamma, "variants": {}}
    for name, extra in tqdm(variants.items(), desc="transformers"):
        def generate(ids, extra=extra):
            with torch.no_grad():
                return target.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens,
                                       min_new_tokens=args.max_new_tokens, **extra)
        start = time.perf_counter()
        generate(prompts[0])
        sync()
        warm_s = time.perf_counter() - start
        seconds, outputs = 0.0, []
        for ids in prompts[1:]:
            start = time.perf_counter()
            out = generate(ids)
            sync()
            seconds += time.perf_counter() - start
            outputs.append(out[0, args.prompt_len:].tolist())
        tokens = args.max_new_tokens * len(outputs)
        results["variants"][name] = {"tokens_per_s": tokens / seconds, "first_call_s": warm_s,
                                     "outputs_identical_to_ours": sum(
                                         a == b for a, b in zip(outputs, ours_greedy))}
    results["prompts"] = len(prompts) - 1
    return results


def ours_on_peer_prompts(models: dict, args) -> tuple[float, list[list[int]]]:
    """Our greedy autoregressive tokens/s and outputs on the peers' prompts, at
    batch 1 and end to end (prefill included) as the peers' ``generate`` runs."""
    target, params = models["target"]
    fn = api.make_generate_fn(target=target, method="autoregressive",
                              max_new_tokens=args.max_new_tokens)
    prompts = random_prompts(target.vocab_size, 1, args.prompt_len, args.repeats + 1, seed=1)
    greedy = api.sampling_params()
    jax.block_until_ready(fn(params, params, prompts[0], jax.random.PRNGKey(0), greedy))
    seconds, outs = 0.0, []
    for prompt in prompts[1:]:
        total_s, out = timing.seconds(fn, params, params, prompt, jax.random.PRNGKey(0), greedy)
        seconds += total_s
        outs.append(np.asarray(out.tokens[0, :args.max_new_tokens]).tolist())
    return args.max_new_tokens * len(outs) / seconds, outs


def match_peers_with_ours(section: dict) -> None:
    """Gives each peer variant our end-to-end tokens/s for the same kind of run
    on the same prompts (batch 1): autoregressive for theirs, ``specdecode``
    at the same G and regime for their assisted generation."""
    peers = section["peers"]
    for name, variant in peers["variants"].items():
        if "assisted" not in name:
            variant["ours_tokens_per_s"] = peers["ours_autoregressive_tokens_per_s"]
            continue
        ours = [r for r in section["decoding"] if r["batch"] == 1 and r["method"] ==
                "specdecode" and r["gamma"] == peers["gamma"] and r["regime"] in name]
        variant["ours_tokens_per_s"] = (sum(x["tokens"] for x in ours[0]["runs"]) / sum(
            x["decode_s"] + x["prefill_s"] for x in ours[0]["runs"]) if ours else None)


# -- report --------------------------------------------------------------------------------

def main(argv=None):
    args = parse_args(argv)
    report = {"environment": timing.environment(), "backend": jax.default_backend(),
              "settings": {k: v for k, v in vars(args).items() if k not in ("out", "markdown")},
              "by_dtype": {}}
    for dtype in args.dtypes:
        section = report["by_dtype"][dtype] = {}
        section["limits"] = timing.device_limits(dtype)
        models = build_models(args, dtype)
        section["weight_bytes"] = {role: weight_bytes(p) for role, (_, p) in models.items()}
        section["steps"] = measure_steps(models, args, section["limits"])
        timing.write_report(report, args.out)
        rows = section["decoding"] = []
        jobs = [(b, c) for b in args.batch_sizes for c in decode_configs(args)]
        prefill_by_role = prefill_fns(models, args)
        for batch, config in tqdm(jobs, desc=f"decoding ({dtype})"):
            rows.append(run_decode(config, models, args, batch, section["steps"],
                                   prefill_by_role))
            timing.write_report(report, args.out)
        section["predicted"] = predict(rows, args.acceptance)
        if args.peers:
            ours_tokens_per_s, ours = ours_on_peer_prompts(models, args)
            section["peers"] = run_peers(models, args, dtype, ours)
            section["peers"]["ours_autoregressive_tokens_per_s"] = ours_tokens_per_s
            match_peers_with_ours(section)
        timing.write_report(report, args.out)
        del models
    timing.print_markdown(markdown(report), args.markdown)


def markdown(report: dict) -> str:
    env, s = report["environment"], report["settings"]
    weights = "random weights of the exact shapes" if s["random_weights"] else "real weights"
    lines = [f"{s['target']} <- {s['drafter']} ({weights}); prompt {s['prompt_len']} tokens, "
             f"{s['max_new_tokens']} new tokens, greedy; kernels "
             f"{s.get('kernel_layout', 'in_out')}, matmul {s.get('matmul_kernel', 'xla')}; "
             f"{env['machine']}, jax {env['jax']}.", ""]
    for dtype, sec in report["by_dtype"].items():
        lim = sec["limits"]
        lines += [f"### {dtype} ({report['backend']})", "",
                  f"Device: read {lim['read_gb_s']:.1f} GB/s, copy {lim['copy_gb_s']:.1f} GB/s, "
                  f"{dtype} matmul {lim['matmul_gflop_s']:.0f} GFLOP/s. Weights: " + ", ".join(
                      f"{r} {b / 1e9:.2f} GB" for r, b in sec["weight_bytes"].items()), "",
                  "| model | batch | K | in-loop step ms | weight GB/s | of copy rate | "
                  "of read rate |", "|---|---|---|---|---|---|---|"]
        for role, by_b in sec["steps"].items():
            for b, by_k in by_b.items():
                for k, st in by_k.items():
                    lines.append(f"| {role} | {b} | {k} | {1e3 * st['step_s']:.2f} | "
                                 f"{st['weight_gb_s']:.1f} | {st['of_copy_bandwidth']:.2f} | "
                                 f"{st.get('of_read_rate', float('nan')):.2f} |")
        lines += ["", "| batch | configuration | tokens/s | vs AR | round ms | tokens/round | "
                  "acceptance | round overhead | first call s | recompiles |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for row in sec["decoding"]:
            ar = next(r for r in sec["decoding"] if r["batch"] == row["batch"] and not r["gamma"])
            acc = f"{row['acceptance']:.2f}" if "acceptance" in row else "–"
            lines.append(f"| {row['batch']} | {row['name']} | {row['decode_tokens_per_s']:.2f} | "
                         f"{row['decode_tokens_per_s'] / ar['decode_tokens_per_s']:.2f}x | "
                         f"{1e3 * row['round_s']:.1f} | {row['tokens_per_round']:.2f} | {acc} | "
                         f"{100 * row['round_overhead']:+.1f}% | {row['first_call_s']:.1f} | "
                         f"{row['recompiles_after_first_call']} |")
        if sec["predicted"]:
            lines += ["", "Predicted for the real pair at CPU-measured acceptance (none-accepted "
                      "round time, i.i.d. acceptance):", "",
                      "| batch | method | G | acceptance | tokens/round | tokens/s | vs AR |",
                      "|---|---|---|---|---|---|---|"]
            for p in sec["predicted"]:
                lines.append(f"| {p['batch']} | {p['method']} | {p['gamma']} | "
                             f"{p['acceptance']:.2f} | {p['tokens_per_round']:.2f} | "
                             f"{p['tokens_per_s']:.2f} | {p['speedup_vs_autoregressive']:.2f}x |")
        if "peers" in sec:
            peers = sec["peers"]
            ours = peers["ours_autoregressive_tokens_per_s"]
            lines += ["", f"Peers, batch 1, end to end (prefill included on both sides), the "
                      f"same weights and prompts: transformers {peers['transformers']} (torch "
                      f"{peers['torch']}), {peers['prompts']} prompts; ours: autoregressive "
                      f"for their autoregressive rows, specdecode G={peers['gamma']} in the "
                      "same regime for their assisted rows.", "",
                      "| peer | tokens/s | ours tokens/s | ours / peer | first call s | "
                      "greedy outputs = ours AR |", "|---|---|---|---|---|---|"]
            for name, v in peers["variants"].items():
                ours = v.get("ours_tokens_per_s")
                ratio = f"{ours / v['tokens_per_s']:.2f}x" if ours else "–"
                lines.append(f"| {name} | {v['tokens_per_s']:.2f} | "
                             f"{ours or float('nan'):.2f} | {ratio} | {v['first_call_s']:.1f} | "
                             f"{v['outputs_identical_to_ours']}/{peers['prompts']} |")
        lines.append("")
    if report["backend"] == "cpu":
        lines.append("GPU: not measured in this run (no accelerator); the command in the "
                     "module docstring produces the same tables there.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
