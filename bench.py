"""Benchmark train_ddp.py's own training loop: tokens/s, step time, peak memory, TFLOP/s and MFU.

    python bench.py --config configs/gemma-4-12b.json --gpus 1,2 --runs plain,frugal-compile,fast-compile

Each run launches `torchrun --nproc_per_node=GPUS train_ddp.py` (the real script, not a copy) on a
model built from --config with random weights, over synthetic conversations truncated to exactly
--seq-len tokens (no padding, every position a target), and reads its metrics.jsonl. Steps 2..N are
the steady window (step 1 holds warm-up: allocator growth, kernel selection). The first name of --runs is
the baseline of the "vs base" column, at each GPU count; every run uses the same --samples per GPU per step.
With several --gpus (1 among them), each run is measured at each count, alone, and "scaling" is SPEC's
efficiency: target tokens/s at N > 1 GPUs over N x the same run's at 1 GPU. "save s" is the adapter's save
(metrics.jsonl's save_s). A failed run is the baseline of nothing.

FLOPs per token (model FLOPs, recomputation not counted):
  4 x (decoder Linear params + LM head)  forward 2P + backward input-gradients 2P; frozen weights
                                         need no weight gradients (LoRA's own FLOPs are < 1%)
  + 12 x context x heads x head_dim per layer   attention QK^T and AV, forward 1x + backward 2x,
                                         context = mean causal (or sliding-window) span of a token inside
                                         its own conversation (with --data: over the file's conversations,
                                         tokenized as the runs do; packed or not, a token sees only its own)
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import guards

HERE = Path(__file__).resolve().parent
PEAK_BF16_TFLOPS = {"H200": 790.0, "H100": 790.0}  # measured dense bf16 matmul peak (device notes: 769-798)

# name -> environment overrides of train_ddp.py constants
RUNS = {
    # SPEC's reference loop: full FP32 logits, PEFT's FP32 adapter inputs, every layer checkpointed, SDPA
    "plain": {
        "CE_CHUNK_TOKENS": "0",
        "LORA_BF16_INPUTS": "0",
        "GRADIENT_CHECKPOINTING": "1",
        "MICRO_BATCH": "1",
        "ATTENTION_KERNEL": "sdpa",
    },
    "defaults": {"MICRO_BATCH": "1"},  # train_ddp.py's defaults
    # one constant picks the layout (memory_budget.plan_for_memory_target)
    "frugal": {"MEMORY_TARGET_GIB": "24.5", "MICRO_BATCH": "1"},
    "fast": {"MEMORY_TARGET_GIB": "130", "MICRO_BATCH": "1"},
    "fast-compile": {"MEMORY_TARGET_GIB": "130", "MICRO_BATCH": "1", "COMPILE_LAYERS": "1"},
    "frugal-compile": {"MEMORY_TARGET_GIB": "24.5", "MICRO_BATCH": "1", "COMPILE_LAYERS": "1"},
    # explicit layouts
    "no-ckpt": {"GRADIENT_CHECKPOINTING": "0", "MICRO_BATCH": "1"},
    "ckpt-half": {"GRADIENT_CHECKPOINTING": "2", "MICRO_BATCH": "1"},
    "micro4": {"GRADIENT_CHECKPOINTING": "1", "MICRO_BATCH": "4"},
    "micro2-no-ckpt": {"GRADIENT_CHECKPOINTING": "0", "MICRO_BATCH": "2"},
    "offload-chunk64": {
        "GRADIENT_CHECKPOINTING": "1",
        "CHECKPOINT_OFFLOAD": "1",
        "CE_CHUNK_TOKENS": "64",
        "MICRO_BATCH": "1",
    },
    "pad1": {"PAD_TO_MULTIPLE": "1"},  # varied-length data: every batch its own shape
    "pad64": {"PAD_TO_MULTIPLE": "64"},
    "micro4-ungrouped": {"MICRO_BATCH": "4", "GROUP_BY_LENGTH": "0"},  # varied-length data: padding
    "micro4-grouped": {"MICRO_BATCH": "4", "GROUP_BY_LENGTH": "1"},
}


def synthetic_conversations(path: Path, n: int, min_words: int) -> None:
    """Conversations long enough that every one is truncated to exactly MAX_LEN tokens."""
    words = "gradient token rank batch memory network device update adapter sequence value".split()
    with open(path, "w") as f:
        for i in range(n):
            text = " ".join(words[(i + j) % len(words)] for j in range(min_words))
            f.write(
                json.dumps(
                    {"messages": [{"role": "user", "content": "Continue."}, {"role": "assistant", "content": text}]}
                )
                + "\n"
            )


def train_flops_per_token(config_path: str, lengths: list[int]) -> float:
    """Model FLOPs per token, for conversations of `lengths` tokens (a token attends within its own)."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(config_path).get_text_config()
    tokens = sum(lengths)
    hidden, linear, attention = cfg.hidden_size, 0, 0
    for i, kind in enumerate(cfg.layer_types):
        layer = cfg.per_layer_config[i]
        q, kv = cfg.num_attention_heads * layer.head_dim, layer.num_key_value_heads * layer.head_dim
        has_v = not (cfg.attention_k_eq_v and kind == "full_attention")
        linear += hidden * (2 * q + kv * (1 + has_v)) + 3 * hidden * cfg.intermediate_size
        span = math.inf if kind == "full_attention" else cfg.sliding_window
        context = sum(causal_span_sum(n, span) for n in lengths) / tokens
        attention += 12 * context * q
    return 4 * (linear + hidden * cfg.vocab_size) + attention


def causal_span_sum(n: int, span: float) -> int:
    """sum over t < n of min(t + 1, span): the keys each of a conversation's n tokens sees."""
    full = int(min(n, span))
    return full * (full + 1) // 2 + (n - full) * full


def conversation_lengths(data: Path, model_id: str, max_len: int) -> list[int]:
    """Token lengths of the file's conversations through model_id's chat template, cut at max_len."""
    from chat_data import ChatDataset, chat_tokenizer, load_conversations

    return ChatDataset(load_conversations(str(data)), chat_tokenizer(model_id), max_len, True).token_lengths


def run_one(name: str, gpus: int, overrides: dict, args, data: Path, work: Path, log: Path) -> dict:
    out = work / f"{name}-{gpus}gpu"
    samples = args.samples
    micro = int(overrides.get("MICRO_BATCH", "1"))  # MEMORY_TARGET_GIB may re-split MICRO_BATCH x ACCUM_STEPS
    env = {
        **os.environ,
        "MODEL_CONFIG": str(Path(args.config).resolve()),
        "MODEL_ID": args.model_id,  # the tokenizer (weights come from MODEL_CONFIG)
        "DATA_PATH": str(data),
        "OUTPUT_DIR": str(out),
        "MAX_LEN": str(args.seq_len),
        "ASSISTANT_ONLY_LOSS": "1" if args.data else "0",
        "MAX_STEPS": str(args.steps),
        "EPOCHS": "1000",
        "LR": "1e-4",
        "LORA_R": "16",
        "LORA_ALPHA": "32",
        "LORA_DROPOUT": "0.05",
        "ACCUM_STEPS": str(samples // micro),
        "DRIFT_CHECK_EVERY": "0",
        "RESUME": "",
        "LOG_EVERY": "1",
        **overrides,
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={gpus}",
        str(HERE / "train_ddp.py"),
    ]
    print(f"== {name} on {gpus} GPU(s): {' '.join(f'{k}={v}' for k, v in overrides.items())}", flush=True)
    failed = launch(cmd, env, out, args, output := work / f"{out.name}.out")
    text = output.read_text(errors="replace")
    with open(log, "a") as f:
        f.write(f"\n===== {name} on {gpus} GPU(s) {overrides} ({failed or 'exit 0'})\n{text}")
    metrics = out / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    steady = [r for r in records if "step_time_s" in r and r["step"] >= 2]
    if failed and "then did not exit" in failed:
        failed = f"trained {max((r['step'] for r in records if 'loss' in r), default=0)} steps, {failed}"
    elif failed or not steady:
        failed = "OOM" if "OutOfMemory" in text else failed or "no steady step"
    if failed:
        print(f"   failed ({failed}): {' | '.join(text.strip().splitlines()[-3:])}", flush=True)
    if not steady:
        return {"name": name, "gpus": gpus, "failed": failed}
    seconds = sum(r["step_time_s"] for r in steady)
    result = {
        "name": name,
        "gpus": gpus,
        "failed": failed,
        "step_s": seconds / len(steady),
        "target_tok_s": sum(r["targets"] for r in steady) / seconds,
        "tok_s": sum(r["tokens"] for r in steady) / seconds,
        "padding": sum(r["padding"] for r in steady) / len(steady),
        "peak_alloc_gib": max(r.get("peak_mem_gib", 0) for r in records),
        "peak_reserved_gib": max(r.get("peak_reserved_gib", 0) for r in records),
        "predicted_gib": next((r["predicted_peak_gib"] for r in records if "predicted_peak_gib" in r), None),
        "save_s": next((r["save_s"] for r in records if r.get("saved") == "adapter"), None),
    }
    print(f"   {json.dumps(result)}", flush=True)
    return result


def launch(cmd: list, env: dict, out: Path, args, output: Path) -> str | None:
    """Run one job, its output into `output`. None when it trained and exited 0; else what went wrong. A job
    that saved its adapter (training is over) but is still running --exit-timeout s later is ended with
    every process below it: it would have hung a user's terminal too."""
    with open(output, "w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    start, trained = time.monotonic(), None
    while proc.poll() is None:
        time.sleep(0.5)
        if trained is None and (out / "adapter").is_dir():
            trained = time.monotonic()
        if trained is not None and time.monotonic() - trained > args.exit_timeout:
            guards.kill_tree(proc)
            return f"then did not exit within {args.exit_timeout:.0f} s"
        if time.monotonic() - start > args.run_timeout:
            guards.kill_tree(proc)
            return f"timed out after {args.run_timeout:.0f} s"
    return f"exit {proc.returncode}" if proc.returncode else None


def gpu_counts(text: str) -> list[int]:
    """--gpus: comma-separated GPU counts, each >= 1 (1,2,4: each run at each count)."""
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"comma-separated GPU counts >= 1, e.g. 1,2 (got {text!r})")
    return list(dict.fromkeys(counts))


def compare(results: list[dict]) -> None:
    """Adds to each measured result "vs_base" (its target tokens/s over the first run name's at the same GPU
    count) and, at N > 1 GPUs, "scaling" (over N x the same run's at 1 GPU); None where that reference failed."""
    good = {(r["name"], r["gpus"]): r["target_tok_s"] for r in results if "step_s" in r and not r["failed"]}
    first = results[0]["name"]
    for r in results:
        if "step_s" in r:
            base, one = good.get((first, r["gpus"])), good.get((r["name"], 1))
            r["vs_base"] = r["target_tok_s"] / base if base else None
            r["scaling"] = r["target_tok_s"] / (r["gpus"] * one) if one and r["gpus"] > 1 else None


def run_names(text: str) -> str:
    """--runs: comma-separated names from RUNS (checked), in order."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))  # one folder per run
    unknown = [n for n in names if n not in RUNS]
    if unknown or not names:
        said = (
            f"unknown run{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
            if unknown
            else "no run named"
        )
        raise argparse.ArgumentTypeError(f"{said}; known runs: {', '.join(RUNS)}")
    return ",".join(names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(HERE / "configs" / "gemma-4-12b.json"))
    ap.add_argument("--runs", type=run_names, default="plain,defaults", help=f"comma-separated, from {', '.join(RUNS)}")
    ap.add_argument("--gpus", type=gpu_counts, default=[1], help="GPU counts, e.g. 1,2: every run at each")
    ap.add_argument("--model-id", default=str(HERE / "assets" / "tiny-gemma4"), help="where the tokenizer comes from")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--samples", type=int, default=8, help="samples per GPU per optimizer step")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="bench-out", help="folder for bench.log (every run's output) and results.json")
    ap.add_argument("--run-timeout", type=float, default=300, help="seconds before a run is killed")
    ap.add_argument(
        "--exit-timeout", type=float, default=30, help="seconds a run may take to exit once its adapter is saved"
    )
    ap.add_argument("--set", action="append", default=[], help="extra KEY=VALUE for every run")
    ap.add_argument(
        "--data",
        default="",
        help="a chat JSONL instead of fixed-length synthetic rows (assistant-only loss, real padding)",
    )
    args = ap.parse_args()

    import torch

    work, out = Path(tempfile.mkdtemp(prefix="bench-")), Path(args.out)  # checkpoints stay in the temp folder
    out.mkdir(parents=True, exist_ok=True)
    log = out / "bench.log"
    log.write_text("")
    data = Path(args.data).resolve() if args.data else work / "synthetic.jsonl"
    if not args.data:
        rows = args.samples * max(args.gpus) * (args.steps + 1) * 2
        synthetic_conversations(data, n=rows, min_words=args.seq_len * 2)
    extra = dict(kv.split("=", 1) for kv in args.set)
    results = [
        run_one(name, gpus, {**RUNS[name], **extra}, args, data, work, log)
        for name in args.runs.split(",")
        for gpus in args.gpus
    ]
    compare(results)

    lengths = conversation_lengths(data, args.model_id, args.seq_len) if args.data else [args.seq_len]
    flops = train_flops_per_token(args.config, lengths)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), None)
    print(
        f"\n{gpu} | {Path(args.config).name} | seq {args.seq_len} | {args.samples} samples/GPU/step | "
        f"steady steps 2..{args.steps} | {flops / 1e9:.1f} GFLOP/token"
    )
    print(
        "| run | GPUs | target tok/s | non-pad tok/s | padding | step s | peak alloc GiB | peak reserved GiB | "
        "predicted GiB | model TFLOP/s per GPU | MFU | save s | vs base | scaling |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "step_s" not in r:
            print(f"| {r['name']} (failed: {r['failed']}) | {r['gpus']} | | | | | | | | | | | | |")
            continue
        tflops = r["tok_s"] * flops / 1e12 / r["gpus"]
        mfu = f"{100 * tflops / peak:.1f}%" if peak else "n/a"
        pred = f"{r['predicted_gib']:.1f}" if r["predicted_gib"] else ""
        save = f"{r['save_s']:.2f}" if r["save_s"] is not None else ""
        vs_base = f"{r['vs_base']:.2f}x" if r["vs_base"] is not None else ""
        scaling = f"{100 * r['scaling']:.1f}%" if r["scaling"] is not None else ""
        name = f"{r['name']} (failed: {r['failed']})" if r["failed"] else r["name"]
        print(
            f"| {name} | {r['gpus']} | {r['target_tok_s']:,.0f} | {r['tok_s']:,.0f} | {100 * r['padding']:.1f}% | "
            f"{r['step_s']:.2f} | {r['peak_alloc_gib']:.1f} | {r['peak_reserved_gib']:.1f} | {pred} | {tflops:.0f} | "
            f"{mfu} | {save} | {vs_base} | {scaling} |"
        )
    if max(args.gpus) > 1 and 1 not in args.gpus:
        print("scaling: needs each run at 1 GPU too (--gpus 1,...)")
    (out / "results.json").write_text(
        json.dumps({"args": vars(args), "gpu": gpu, "flops_per_token": flops, "results": results}, indent=1)
    )
    if any(r["failed"] for r in results):
        sys.exit(1)  # every measured step is printed above, but a run that failed (or never exited) fails the bench


if __name__ == "__main__":
    main()
