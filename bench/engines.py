"""Benchmark: lemon's embedded CPU engine (TransformersBackend) against the other CPU engines, same work.

Every engine decodes the same chat prompts with the same model, greedy, exactly ``--max-tokens`` new tokens
per prompt (end-of-turn is suppressed in every engine, so no engine stops early and the token counts match),
at batch sizes 1/8/32 (the first b prompts as one batch). Each engine runs in its own subprocess, so its
peak RSS (``getrusage`` in that process: its own, or its largest child's) is its own. Per engine and batch:
generated tokens/s, and prefill and decode separately, measured the same way for every engine: prefill is a
run of the same batch with ``max_tokens=1`` (prompt + one token), decode tok/s is the remaining
``b * (max_tokens - 1)`` tokens over the remaining time. Before each batch size every engine runs that
batch's prefill once untimed (a steady state: lemon's stages run many batches per process, and vLLM's engine
start runs such a pass itself). The last line is
``ratio=<transformers (the embedded default) tok/s / best non-lemon engine tok/s>`` at the largest batch.

Engines:

* ``transformers``: ``lemon_core.backends.TransformersBackend`` as lemon runs it by default: fp32, lemon's fused
  forward pass (``lemon_core/backends/fused_decoder.py``) on projections packed for oneDNN
  (``lemon_core/backends/packed_linear.py``), the batch's shared prompt prefix run once
  (``lemon_core/backends/shared_prefix.py``), torch's default thread count (one per core). vLLM's prefix cache is
  on by default but caches only full blocks (128 tokens on CPU), so these short prompts hit nothing there.
* ``transformers-unfused``: the same with ``fused_forward=False`` (transformers' own forward on packed layers,
  every row's whole prompt): what the fused forward and the shared prefix buy.
* ``transformers-dense``: the same with ``packed_weights=False`` (plain ``F.linear``, MKL sgemm): what packing buys.
* ``transformers-fp32-head``: the same with ``screened_argmax=False`` (each greedy pick from the fp32 logits
  over the whole vocabulary): what the bf16 screen of the output head buys (``screened_argmax.py``).
* ``transformers-t1``: the default with one torch thread.
* ``vllm``: ``vllm.LLM`` (fp32) in the Python given by ``--vllm-python`` (e.g. ``.venv-vllm/bin/python`` made by
  ``.ci/vllm_cpu_check.sh``), one OpenMP thread bound to each core (``--vllm-threads``, default all);
  skipped when ``import vllm`` fails there.
* ``llamacpp``: ``llama_cpp.Llama`` (llama-cpp-python) in ``--llama-python`` on an f32 GGUF of the same model
  (``--gguf``, or converted from ``--model`` with llama.cpp's ``convert_hf_to_gguf.py`` given by
  ``--llama-convert``), 1 thread. Its Python API decodes one sequence at a time, so batch b is b prompts in
  turn. Skipped when ``import llama_cpp`` fails (docs/gpu_check.md says what building it here took).

    python bench/engines.py                           # Qwen2.5-Coder-0.5B-Instruct (lemon models pull), 128 tokens
    python bench/engines.py --rounds 3                # engines in turn 3 times: medians and each round's ratio
    python bench/engines.py --quick --model PATH      # smoke run: batch 1 and 8, 32 tokens

With ``--rounds N`` the engines run in turn N times (A, B, A, B, ...), so drift on a shared machine hits them
alike; each figure is then the median over the rounds (peak RSS the largest), the ratio line is computed from
those medians, and ``ratio per round:`` shows the spread (vLLM's own tok/s moved 3.5% between single runs here).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENGINES = ("transformers", "transformers-unfused", "transformers-dense", "transformers-fp32-head", "transformers-t1",
           "vllm", "llamacpp")
# TransformersBackend options of each lemon variant (transformers-t1 is the default on one thread)
TRANSFORMERS_VARIANTS: dict[str, dict[str, bool]] = {
    "transformers": {},
    "transformers-unfused": {"fused_forward": False},
    "transformers-dense": {"packed_weights": False},
    "transformers-fp32-head": {"screened_argmax": False},
}
BASELINE = "transformers"
DEFAULT_THREADS = 0  # "threads" value meaning: leave the engine its own default (torch: one thread per core)

# 32 short chat prompts of the kind lemon's agents get (arithmetic word problems, code, a plan).
_TEMPLATES = (
    "Janet has {a} apples and buys {b} more. How many apples does she have now? Think step by step.",
    "A train travels {a} miles per hour for {b} hours. How far does it go? Explain briefly.",
    "Write a Python function that returns the sum of the first {a} multiples of {b}.",
    "List {b} roles a team of agents needs to check the answer to {a} times {b}, and say why.",
)
PROMPTS = [_TEMPLATES[i % 4].format(a=3 + 7 * i, b=2 + i % 9) for i in range(32)]


# --- the workers (one per engine, each in its own process) ----------------------------------------
def usable_cores() -> list[int]:
    """The cores this process may run on (its affinity mask, which a container's CPU set narrows)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(generate: Any, batches: Sequence[int], max_tokens: int) -> list[dict[str, Any]]:
    """Per batch size: tokens/s over the whole run, and prefill (a max_tokens=1 run) and decode apart.

    ``generate(prompts, max_tokens)`` returns the number of tokens it generated."""
    generate(PROMPTS[:1], 2)  # warm-up: weights paged in, kernels chosen
    rows = []
    for b in batches:
        prompts = PROMPTS[:b]
        # Untimed warm-up at this batch's own shape, for every engine alike: the engine's first pass over a
        # batch of this size pays first-touch page faults for its activations (transformers, batch 32, one backend
        # built after a 1-prompt warm-up: prefill 6.0-7.2 s the first time, 4.6-5.3 s after), and vLLM's engine
        # start already runs such a pass.
        generate(prompts, 1)
        prefill_s = timed(lambda p=prompts: generate(p, 1))
        t0 = time.perf_counter()
        tokens = generate(prompts, max_tokens)
        total_s = time.perf_counter() - t0
        decode_s = total_s - prefill_s  # <= 0 only when load on a shared machine skewed the two runs
        rows.append(dict(batch=b, tokens=tokens, seconds=round(total_s, 3), tok_s=tokens / total_s,
                         prefill_s=round(prefill_s, 3),
                         decode_tok_s=(tokens - b) / decode_s if decode_s > 0 else float("nan")))
    return rows


def transformers_worker(model: str, threads: int, batches: Sequence[int], max_tokens: int,
                        options: dict[str, bool] | None = None) -> list[dict[str, Any]]:
    from lemon_core.backends.base import GenerationRequest
    from lemon_core.backends.transformers_backend import TransformersBackend

    backend = TransformersBackend(model, num_threads=threads or None, max_batch_size=max(batches),
                                  loop_stop_repeats=0, **(options or {}))  # vLLM decodes loops to the end too
    backend.eos_ids = set()  # no early stop: every engine generates exactly max_tokens per prompt

    def generate(prompts: list[str], n: int) -> int:
        out = backend.generate([GenerationRequest.chat(None, p, max_tokens=n) for p in prompts])
        errors = [c.error for c in out if c.error]
        if errors:
            raise RuntimeError(errors[0])
        return sum(c.completion_tokens for c in out)

    return measure(generate, batches, max_tokens)


def vllm_worker(model: str, threads: int, batches: Sequence[int], max_tokens: int) -> list[dict[str, Any]]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(i) for i in usable_cores()[:threads]))
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: its RSS is ours
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, dtype="float32", seed=0, max_model_len=1024, max_num_seqs=max(batches))
    tokenizer = llm.get_tokenizer()

    def prompt_ids(text: str) -> list[int]:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids)

    def generate(prompts: list[str], n: int) -> int:
        ids = [prompt_ids(p) for p in prompts]
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        outs = llm.generate([{"prompt_token_ids": list(i)} for i in ids], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)

    return measure(generate, batches, max_tokens)


def llamacpp_worker(gguf: str, threads: int, batches: Sequence[int], max_tokens: int) -> list[dict[str, Any]]:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=1024, seed=0, verbose=False)
    stops = {llm.token_eos()} | {t for s in (b"<|im_end|>", b"<|endoftext|>")
                                  for t in llm.tokenize(s, add_bos=False, special=True)[:1]}
    no_stop = {t: -1e9 for t in stops}  # like vLLM's ignore_eos

    def generate(prompts: list[str], n: int) -> int:
        total = 0
        for p in prompts:  # the Llama API decodes one sequence at a time
            llm.reset()  # no prompt-prefix reuse between runs: every run pays its prefill
            out = llm.create_chat_completion([{"role": "user", "content": p}], max_tokens=n, temperature=0.0,
                                             logit_bias=no_stop)
            total += out["usage"]["completion_tokens"]
        return total

    return measure(generate, batches, max_tokens)


def peak_rss_mib() -> float:
    """This process's peak RSS, or its largest child's if bigger (Linux reports KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def worker_main(args: argparse.Namespace) -> None:
    kind, threads = args.worker, args.threads
    target = args.gguf if kind == "llamacpp" else args.model
    if kind in TRANSFORMERS_VARIANTS:
        rows = transformers_worker(target, threads, args.batches, args.max_tokens, TRANSFORMERS_VARIANTS[kind])
    else:
        fn = {"vllm": vllm_worker, "llamacpp": llamacpp_worker}[kind]
        rows = fn(target, threads, args.batches, args.max_tokens)
    print("RESULT " + json.dumps({"rows": rows, "peak_rss_mib": peak_rss_mib()}), flush=True)


# --- the driver -----------------------------------------------------------------------------------
def can_import(python: str, module: str) -> bool:
    """Whether ``python`` exists and imports ``module``."""
    try:
        return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0
    except OSError:  # no such interpreter
        return False


def run_engine(python: str, kind: str, threads: int, args: argparse.Namespace, gguf: str | None = None) -> dict:
    """One engine in its own process; returns its rows and peak RSS (which the process measures itself)."""
    cmd = [python, str(Path(__file__).resolve()), "--worker", kind, "--threads", str(threads), "--model",
           args.model, "--max-tokens", str(args.max_tokens), "--batches", *map(str, args.batches)]
    if gguf:
        cmd += ["--gguf", gguf]
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if threads != DEFAULT_THREADS:
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        env.pop("OMP_NUM_THREADS", None)  # the default: what a user's `make run` gets
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate()
    result = next((json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")), None)
    if proc.returncode != 0 or result is None:
        tail = (err.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{kind} worker exited {proc.returncode}: {tail}")
    return result


def convert_to_gguf(model: str, convert_script: str, python: str, dest: Path) -> str:
    """An f32 GGUF of the HF folder ``model`` (llama.cpp's convert_hf_to_gguf.py), cached at ``dest``."""
    if not dest.exists():
        subprocess.run([python, convert_script, model, "--outtype", "f32", "--outfile", str(dest)], check=True,
                       capture_output=True)
    return str(dest)


def engine_plan(args: argparse.Namespace) -> list[tuple[str, str, str, int, str | None]]:
    """(name, python, worker kind, threads, gguf) of every engine that can run; prints why others are skipped."""
    plan: list[tuple[str, str, str, int, str | None]] = []
    for name in args.engines:
        if name in TRANSFORMERS_VARIANTS:
            plan.append((name, sys.executable, name, DEFAULT_THREADS, None))
        elif name == "transformers-t1":
            plan.append((name, sys.executable, "transformers", 1, None))
        elif name == "vllm":
            if args.vllm_python and can_import(args.vllm_python, "vllm"):
                plan.append((name, args.vllm_python, "vllm", args.vllm_threads, None))
            else:
                print(f"vllm: not installed, skipped (no `import vllm` in --vllm-python={args.vllm_python})")
        elif name == "llamacpp":
            python = args.llama_python or sys.executable
            gguf = args.gguf
            if not can_import(python, "llama_cpp"):
                print(f"llamacpp: not installed, skipped (no `import llama_cpp` in {python}; see docs/gpu_check.md)")
                continue
            if gguf is None and args.llama_convert:
                gguf = convert_to_gguf(args.model, args.llama_convert, sys.executable,
                                       Path(args.model) / "lemon-bench-f32.gguf")
            if gguf is None:
                print("llamacpp: no GGUF, skipped (give --gguf, or --llama-convert PATH/convert_hf_to_gguf.py)")
                continue
            plan.append((name, python, "llamacpp", 1, gguf))
    return plan


def resolve(model: str) -> str:
    from lemon_core.models import resolve_model

    return resolve_model(model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="model alias, folder or HF id")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32], help="batch sizes (<= 32)")
    ap.add_argument("--quick", action="store_true", help="smoke run: batches 1 and 8, 32 tokens")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"),
                    help="a Python with vllm (vllm-cpu) installed")
    ap.add_argument("--vllm-threads", type=int, default=len(usable_cores()),
                    help="cores vLLM's CPU backend binds its OpenMP threads to (one thread per core); default: "
                         "every core, as the embedded default uses (like for like)")
    ap.add_argument("--llama-python", default=None, help="a Python with llama-cpp-python (default: this one)")
    ap.add_argument("--gguf", default=None, help="f32 GGUF of --model for llama.cpp")
    ap.add_argument("--llama-convert", default=None, help="llama.cpp's convert_hf_to_gguf.py, to make the GGUF")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the engines in turn this many times and report each figure's median (and the ratio "
                         "of each round): these machines are noisy (vLLM's tok/s moved 3.5%% between runs here)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--worker", choices=(*TRANSFORMERS_VARIANTS, "vllm", "llamacpp"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(args)
        return 0
    if args.quick:
        args.batches, args.max_tokens = [1, 8], 32
    bad = [b for b in args.batches if not 1 <= b <= len(PROMPTS)]
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1 (got {args.rounds})")
    if bad or args.max_tokens < 2:
        ap.error(f"--batches must be in 1..{len(PROMPTS)} (got {bad}) and --max-tokens >= 2 (got {args.max_tokens})")
    args.model = resolve(args.model)
    print(f"model={args.model} fp32 greedy max_tokens={args.max_tokens} batches={args.batches} "
          f"prompts={len(PROMPTS)}")
    plan, runs = engine_plan(args), {}
    for round_ in range(args.rounds):  # engines in turn, round after round: drift on the machine hits them alike
        label = f"round {round_ + 1}/{args.rounds} " if args.rounds > 1 else ""
        for name, python, kind, threads, gguf in plan:
            try:
                result = run_engine(python, kind, threads, args, gguf)
            except (RuntimeError, subprocess.CalledProcessError) as e:
                print(f"{label}{name}: FAILED {e}")
                continue
            runs.setdefault(name, []).append(result)
            print_rows(label + name, threads, result)
    results = {name: median_result(rounds) for name, rounds in runs.items()}
    if args.rounds > 1:
        for name, _python, _kind, threads, _gguf in plan:
            if name in results:
                print_rows(f"median of {len(runs[name])} {name}", threads, results[name])
        per_round = [baseline_ratio({n: rs[i] for n, rs in runs.items() if i < len(rs)}, max(args.batches))
                     for i in range(args.rounds)]
        print("ratio per round: " + " ".join("nan" if r is None else f"{r:.3f}" for r in per_round))
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "rounds": runs}, indent=1))
    return print_ratio(results, max(args.batches))


def print_rows(label: str, threads: int, result: dict) -> None:
    shown = "default" if threads == DEFAULT_THREADS else threads
    for row in result["rows"]:
        print(f"{label:22s} threads={shown} batch={row['batch']:2d} tokens={row['tokens']:5d} "
              f"{row['tok_s']:7.2f} tok/s  prefill {row['prefill_s']:6.2f}s  decode {row['decode_tok_s']:7.2f} "
              f"tok/s  peak_rss={result['peak_rss_mib']:.0f}MiB")


def median_result(rounds: list[dict]) -> dict:
    """One engine's figures over its rounds: the median of each per-batch figure, the largest peak RSS."""
    rows = []
    for i, first in enumerate(rounds[0]["rows"]):
        per_round = [r["rows"][i] for r in rounds]
        rows.append({**first, **{key: statistics.median(row[key] for row in per_round)
                                 for key in ("seconds", "tok_s", "prefill_s", "decode_tok_s")}})
    return {"rows": rows, "peak_rss_mib": max(r["peak_rss_mib"] for r in rounds)}


def tok_s_at(results: dict[str, dict], name: str, batch: int) -> float:
    return next(r["tok_s"] for r in results[name]["rows"] if r["batch"] == batch)


def best_rival(results: dict[str, dict], batch: int) -> str | None:
    """The fastest engine at ``batch`` that is not lemon's (lemon's other variants are shown, not counted)."""
    rivals = [n for n in results if n != BASELINE and not n.startswith("transformers")]
    return max(rivals, key=lambda n: tok_s_at(results, n, batch)) if rivals else None


def baseline_ratio(results: dict[str, dict], batch: int) -> float | None:
    """The baseline's tok/s over the best rival's at ``batch`` (None when either is missing)."""
    rival = best_rival(results, batch)
    if BASELINE not in results or rival is None:
        return None
    return tok_s_at(results, BASELINE, batch) / tok_s_at(results, rival, batch)


def print_ratio(results: dict[str, dict], batch: int) -> int:
    """``ratio=<baseline tok/s / best other engine's tok/s>`` at ``batch``; ``ratio=nan`` without a rival."""
    if BASELINE not in results:
        print(f"ratio=nan ({BASELINE} did not run)")
        return 1
    rival = best_rival(results, batch)
    if rival is None:
        own = tok_s_at(results, BASELINE, batch)
        print(f"ratio=nan (no other engine ran; {BASELINE} {own:.2f} tok/s at batch {batch})")
        return 0
    print(f"best other engine at batch {batch}: {rival} {tok_s_at(results, rival, batch):.2f} tok/s")
    print(f"ratio={baseline_ratio(results, batch):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
