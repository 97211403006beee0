"""Ours against the fair PyTorch peer, Hugging Face ``transformers``, on the same
weights: every benchmark's peer comparison in one place.

* ``bench_models`` (``step_latency``): load time, resident memory and one
  decode / scoring call of a registry model's GGUF file, loaded by
  ``transformers`` (``load_gguf``), against ours on the same file;
* ``bench_speculative`` (``assisted_generation``): greedy autoregressive and
  assisted generation on the registry's GGUF files of a pair;
* ``bench_accelerator`` (``run_peers``): ``transformers`` holding exactly our
  (random) weights (``from_ours``), eager and with a static cache +
  ``torch.compile``, autoregressive and assisted, beside ours end to end.

Greedy outputs are compared token for token with ours. ``torch`` and
``transformers`` (the dev extra) are imported inside the functions: the job
launcher imports every benchmark module.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import statistics
import time
import warnings
from collections.abc import Sequence

import jax
import numpy as np

from benchmarks import child, shared
from specdec_jax import api
from specdec_jax.checkpoints import registry
from specdec_jax.checkpoints.hf_decoder import decoder_config_to_hf, decoder_params_to_hf
from specdec_jax.jobs import tables
from specdec_jax.runtime import timing
from specdec_jax.runtime.progress import tqdm

FILL = 128  # step_latency: tokens already in the cache when K tokens are fed
REPEATS = 10


# -- loading -------------------------------------------------------------------------------

def load_gguf(path: str):
    """A ``transformers`` model read from a GGUF file, float32, in eval mode."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()


# -- bench_accelerator: transformers holding our weights ----------------------------------

def from_ours(model, params, dtype: str):
    """A ``transformers`` model holding exactly our weights."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

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


def run_peers(models: dict, settings, dtype: str, ours_greedy: list[list[int]]) -> dict:
    """Times every ``transformers`` variant of ``settings.peers`` (an accelerator
    benchmark's ``Settings``) greedy at batch 1 on random prompts, its first
    call apart, and counts its outputs equal to ``ours_greedy``."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from transformers import CompileConfig  # noqa: PLC0415

    target = from_ours(*models["target"], dtype)
    drafter = from_ours(*models["drafter"], dtype)
    device = target.device
    prompts = [torch.tensor(p.tokens.tolist(), device=device)
               for p in shared.random_prompts(models["target"][0].vocab_size, 1,
                                              settings.prompt_len, settings.repeats + 1, seed=1)]
    gamma = settings.gammas[len(settings.gammas) // 2]
    for assistant in (target, drafter):
        assistant.generation_config.num_assistant_tokens = gamma
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        assistant.generation_config.assistant_confidence_threshold = 0.0
    compile_config = CompileConfig()
    compile_config._compile_all_devices = True  # its switch to compile on CPU too
    variants = {}
    if "eager" in settings.peers:
        variants["eager autoregressive"] = {}
    if "assisted" in settings.peers:
        variants[f"eager assisted G={gamma} all-accept"] = {"assistant_model": target}
        variants[f"eager assisted G={gamma} none-accepted"] = {"assistant_model": drafter}
    # Last: compiling leaves a compiled forward on the model. On the H200 run the
    # eager assisted variants, timed after it, did not finish in ~170 s (3 prompts
    # x 128 tokens; eager decoding took 2.4 s a prompt); recompiling at every new
    # shape is the suspect, not confirmed. Timed last, it cannot slow the others.
    if "compiled" in settings.peers:
        variants["static cache + torch.compile autoregressive"] = {
            "cache_implementation": "static", "compile_config": compile_config}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    results = {"transformers": transformers.__version__, "torch": torch.__version__,
               "gamma": gamma, "variants": {}}
    new_tokens = settings.max_new_tokens
    for name, extra in tqdm(variants.items(), desc="transformers"):
        def generate(ids, extra=extra):
            with torch.no_grad():
                return target.generate(ids, do_sample=False, max_new_tokens=new_tokens,
                                       min_new_tokens=new_tokens, **extra)
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
            outputs.append(out[0, settings.prompt_len:].tolist())
        tokens = new_tokens * len(outputs)
        results["variants"][name] = {"tokens_per_s": tokens / seconds, "first_call_s": warm_s,
                                     "outputs_identical_to_ours": sum(
                                         a == b for a, b in zip(outputs, ours_greedy))}
    results["prompts"] = len(prompts) - 1
    return results


def ours_on_peer_prompts(models: dict, settings) -> tuple[float, list[list[int]]]:
    """Our greedy autoregressive tokens/s and outputs on the peers' prompts, at
    batch 1 and end to end (prefill included) as the peers' ``generate`` runs."""
    target, params = models["target"]
    new_tokens = settings.max_new_tokens
    fn = api.make_generate_fn(target=target, method="autoregressive", max_new_tokens=new_tokens)
    prompts = shared.random_prompts(target.vocab_size, 1, settings.prompt_len, settings.repeats + 1,
                             seed=1)
    greedy = api.sampling_params()
    jax.block_until_ready(fn(params, params, prompts[0], jax.random.PRNGKey(0), greedy))
    seconds, outs = 0.0, []
    for prompt in prompts[1:]:
        total_s, out = timing.seconds(fn, params, params, prompt, jax.random.PRNGKey(0), greedy)
        seconds += total_s
        outs.append(np.asarray(out.tokens[0, :new_tokens]).tolist())
    return new_tokens * len(outs) / seconds, outs


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


# -- bench_speculative: assisted generation on the registry's GGUF files -------------------

def assisted_generation(target_path, drafter_path, prompts, gamma, max_new_tokens):
    """transformers greedy: plain and assisted generation, same GGUF files."""
    import torch  # noqa: PLC0415

    target, drafter = load_gguf(target_path), load_gguf(drafter_path)
    drafter.generation_config.num_assistant_tokens = gamma
    drafter.generation_config.num_assistant_tokens_schedule = "constant"
    drafter.generation_config.assistant_confidence_threshold = 0.0
    results = {}
    for name, extra in (("autoregressive", {}), ("assisted", {"assistant_model": drafter})):
        seconds, tokens, outputs = 0.0, 0, []
        for prompt in prompts:
            ids = torch.tensor([prompt])
            with torch.no_grad():
                start = time.perf_counter()
                out = target.generate(ids, do_sample=False, max_new_tokens=max_new_tokens,
                                      min_new_tokens=max_new_tokens, **extra)
                seconds += time.perf_counter() - start
            new = out[0, len(prompt):].tolist()
            tokens += len(new)
            outputs.append(new)
        results[name] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
                         "outputs": outputs}
    return results


def check_assisted_peer(target: str, drafter: str, temperatures: Sequence[float]) -> None:
    """The transformers peer reads the registry's GGUF files of both models,
    runs greedy, and needs torch and transformers (the dev extra)."""
    unknown = [name for name in (target, drafter) if name not in registry.MODELS]
    if unknown:
        raise ValueError(f"the transformers peer loads registry models' GGUF files; {unknown} "
                         f"are not registry models ({', '.join(registry.MODELS)}). Set "
                         "bench_speculative.no_peer = True.")
    if 0.0 not in [float(t) for t in temperatures]:
        raise ValueError(f"the transformers peer is compared greedy: temperatures "
                         f"{list(temperatures)} need 0.0, or set no_peer = True.")
    missing = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"the transformers peer needs {' and '.join(missing)} (pip install -e "
                         "'.[dev]'), or set bench_speculative.no_peer = True.")


# -- bench_models: one model's load and calls --------------------------------------------

def step_latency(*, name: str) -> dict:
    """Their side of ``bench_models``: load time, resident memory added by the
    load and the median of one call of K = 1 and K = 6 tokens after ``FILL``
    cached ones (a first call warms up)."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    path = registry.local_path(name)
    gc.collect()
    before, start = child.rss(), time.perf_counter()
    model = load_gguf(path)
    load_s, mem = time.perf_counter() - start, child.rss() - before
    row = {"load_s": load_s, "rss_gb": mem / 2**30}
    with torch.no_grad():
        prefix = torch.ones((1, FILL), dtype=torch.long)
        for k in (1, 6):
            runs = []
            for _ in range(REPEATS + 1):
                cache = transformers.DynamicCache()
                model(prefix, past_key_values=cache, use_cache=True)
                start = time.perf_counter()
                model(torch.ones((1, k), dtype=torch.long), past_key_values=cache,
                      use_cache=True)
                runs.append(time.perf_counter() - start)
            row[f"k{k}_s"] = statistics.median(runs[1:])  # first call warms up
    return row


def compare_assisted(peer: dict, *, ours_autoregressive: dict, ours_speculative: dict,
                     ours_greedy: list, gamma: int) -> dict:
    """``assisted_generation``'s results beside ours (``bench_speculative``'s
    batch-1 rows of the same prompts): tokens/s ratios and identical outputs."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    return {
        "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "gamma": gamma,
        "autoregressive_tokens_per_s": peer["autoregressive"]["tokens_per_s"],
        "assisted_tokens_per_s": peer["assisted"]["tokens_per_s"],
        "ours_over_theirs_assisted": ours_speculative["tokens_per_s"] /
        peer["assisted"]["tokens_per_s"],
        "ours_over_theirs_autoregressive": ours_autoregressive["tokens_per_s"] /
        peer["autoregressive"]["tokens_per_s"],
        "assisted_outputs_identical_to_ours": sum(
            a == b for a, b in zip(peer["assisted"]["outputs"], ours_greedy)),
        "prompts": len(ours_greedy),
    }


# -- reports -------------------------------------------------------------------------------

def assisted_line(peer: dict) -> str:
    """``compare_assisted``'s figures as one sentence."""
    return (f"transformers {peer['transformers_version']} (torch {peer['torch_version']}), "
            f"greedy, G={peer['gamma']}: assisted {peer['assisted_tokens_per_s']:.2f} tok/s, "
            f"ours/theirs {peer['ours_over_theirs_assisted']:.2f}x (AR: "
            f"{peer['ours_over_theirs_autoregressive']:.2f}x); identical outputs "
            f"{peer['assisted_outputs_identical_to_ours']}/{peer['prompts']}")


def accelerator_lines(peers: dict) -> list[str]:
    """``run_peers``'s variants (``match_peers_with_ours`` done) as a sentence and a table."""
    rows = []
    for name, v in peers["variants"].items():
        ours = v.get("ours_tokens_per_s")
        rows.append((name, f"{v['tokens_per_s']:.2f}", f"{ours or float('nan'):.2f}",
                     f"{ours / v['tokens_per_s']:.2f}x" if ours else "–",
                     f"{v['first_call_s']:.1f}",
                     f"{v['outputs_identical_to_ours']}/{peers['prompts']}"))
    return [f"Peers, batch 1, end to end (prefill included on both sides), the same weights and "
            f"prompts: transformers {peers['transformers']} (torch {peers['torch']}), "
            f"{peers['prompts']} prompts; ours: autoregressive for their autoregressive rows, "
            f"specdecode G={peers['gamma']} in the same regime for their assisted rows.", ""
            ] + tables.markdown_table(("peer", "tokens/s", "ours tokens/s", "ours / peer",
                                       "first call s", "greedy outputs = ours AR"), rows)


def models_markdown(report: dict) -> str:
    """``bench_models``'s table: ours / theirs per model, with theirs over ours."""
    env = report["environment"]
    rows = []
    for name, row in report["models"].items():
        o, t = row["ours"], row["transformers"]
        rows.append((name, f"{o['load_s']:.1f} / {t['load_s']:.1f}",
                     f"{o['rss_gb']:.2f} / {t['rss_gb']:.2f}",
                     f"{1e3 * o['k1_s']:.0f} / {1e3 * t['k1_s']:.0f}, "
                     f"{t['k1_s'] / o['k1_s']:.2f}x",
                     f"{1e3 * o['k6_s']:.0f} / {1e3 * t['k6_s']:.0f}, "
                     f"{t['k6_s'] / o['k6_s']:.2f}x"))
    return "\n".join([
        f"CPU float32, {env['machine']}, {env['cpu_count']} cores; jax {env['jax']}, torch "
        f"{report['torch']}, transformers {report['transformers']}; cache fill "
        f"{report['cache_fill']}", ""] + tables.markdown_table(
            ("model", "load s (ours / HF)", "RSS GB (ours / HF)",
             "decode K=1 ms (ours / HF, HF/ours)", "score K=6 ms (ours / HF, HF/ours)"), rows))
