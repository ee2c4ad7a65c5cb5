"""How long, and how many GPU-hours: train_ddp.py's real step timed on your data, before you rent GPUs.

    DATA_PATH=chat.jsonl MODEL_ID=google/gemma-4-12B-it python time_budget.py --gpus-per-node 8 --nodes 1 2

Settings are train_ddp.py's, from the same environment variables (MEMORY_TARGET_GIB's layout and
ATTENTION_KERNEL's choice included). On this machine, with one GPU (or the CPU):
  measured  the data's token lengths through the real chat template (every row up to --rows, sampled
            evenly, the row with the most characters added), the target fraction; train_ddp's forward_backward
            + clip + AdamW step on micro-batches of real rows at the short, typical and long quantiles of that
            length distribution (warm-up steps first), the peak memory of each; one checkpoint save. With
            PACKING=1: the trainer's packed rows (all MAX_LEN wide), one micro-batch of a typical one measured;
            the report says which mode.
            For the whole run: the imports, tokenizing, loading the model and adding the adapters; each
            length's first step (compile, allocator growth, kernel planning); with EVAL_PATH, a forward pass
            of the eval rows at their quantile lengths; saving the adapter.
  modelled  the time of every other micro-batch length (linear between the measured lengths, where attention
            makes it convex, so it errs slightly high; below the shortest, that one's time); the epoch as
            the trainer cuts it (DistributedSampler + length grouping), every rank's own micro-batches, a step
            taking its slowest rank's time; the gradient all-reduce from memory_budget.py at --bus-bw-gbps,
            of which DDP hides what the slowest rank's last backward (2/3 of its micro-batch) covers; the
            checkpoints the trainer writes (SAVE_EVERY, epoch ends). The whole run, launch to adapter (the
            job's last line says its own): start (imports, tokenizing all rows, loading), the first micro-batch,
            the extra time of every measured length's first step once (kernels compiled and planned on a cold
            cache, as on a newly rented node; the job meets them in its first steps, not at each new width),
            training, every evaluation (EVAL_EVERY and the end: each rank's shard of the eval file, the slowest
            rank), the adapter save.
  not modelled: the drift check, waiting for data, saving to slow shared storage, several ranks loading from
            one disk at once, warm compile caches (a job after time_budget on one machine starts faster;
            with --warmup 0 the extra of first steps is not seen).
Configurations the data fill no optimizer step of are named and skipped before anything is measured.
On the CPU this runs whatever model MODEL_ID names (the tiny default) on one thread, as torchrun gives each
rank (unless OMP_NUM_THREADS says otherwise): its times do not transfer to GPUs.
"""

import argparse
import json
import math
import os
import tempfile
import time
from itertools import pairwise
from pathlib import Path

import memory_budget

QUANTILES = {"short": 0.1, "typical": 0.5, "long": 0.9, "longest": 1.0}
FEWER = "use fewer GPUs, a smaller MICRO_BATCH x ACCUM_STEPS, or more data"
BACKWARD_SHARE = 2 / 3  # backward ~ 2x forward FLOPs: the part of the last micro-batch the all-reduce hides behind


def quantile(sorted_values: list[int], q: float) -> int:
    """The nearest-rank quantile of a sorted list."""
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def at_quantiles(rows: list[dict]) -> dict:
    """{quantile name: the row at that quantile of the rows' token lengths}."""
    by_length = sorted(rows, key=lambda r: len(r["input_ids"]))
    lengths = [len(r["input_ids"]) for r in by_length]
    return {name: by_length[lengths.index(quantile(lengths, q))] for name, q in QUANTILES.items()}


def padded(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def interpolate(points: dict[int, float], length: int) -> float:
    """Seconds at `length` from measured {length: seconds}: linear between neighbours and beyond the longest,
    the shortest's time below it (a shorter batch is not faster than the fixed costs)."""
    xs = sorted(points)
    if length <= xs[0]:
        return points[xs[0]]
    if len(xs) == 1:
        return points[xs[0]] * length / xs[0]
    lo, hi = (xs[-2], xs[-1]) if length >= xs[-1] else next((a, b) for a, b in pairwise(xs) if a <= length <= b)
    return points[lo] + (points[hi] - points[lo]) * (length - lo) / (hi - lo)


def epoch_micro_batches(tokens: list[int], group_keys: list[int], rank: int, ranks: int, run) -> list[int]:
    """Padded length of each micro-batch `rank` runs in one epoch, cut as train_ddp.train_loader cuts it:
    its DistributedSampler shard, sorted within each optimizer step by `group_keys` (the trainer's
    ChatDataset.lengths, characters) when GROUP_BY_LENGTH, a partial accumulation window dropped.
    `run`: train_ddp's settings (a train_ddp.Config)."""
    import torch.utils.data as data

    from collate import StepOrder

    sampler = data.DistributedSampler(
        range(len(tokens)), num_replicas=ranks, rank=rank, shuffle=True, seed=run.SEED, drop_last=True
    )
    micro, window = run.MICRO_BATCH, run.MICRO_BATCH * run.ACCUM_STEPS
    order = list(StepOrder(sampler, 0, group_keys if run.GROUP_BY_LENGTH and not run.PACKING else None, window))
    order = order[: len(order) // window * window]
    return [
        padded(max(tokens[i] for i in order[s : s + micro]), run.PAD_TO_MULTIPLE) for s in range(0, len(order), micro)
    ]


def predict(
    measured: dict,
    tokens: list[int],
    group_keys: list[int],
    run,
    gpus_per_node: int,
    nodes: int,
    allreduce_s: float,
) -> dict:
    """Time per epoch and to completion for `nodes` x `gpus_per_node` ranks, from the measured seconds per
    micro-batch by length, the optimizer step and the checkpoint save. Every rank runs its own lengths and
    the all-reduce at the end of each step waits for the slowest: a step takes its slowest rank's time."""
    ranks = gpus_per_node * nodes
    accum = run.ACCUM_STEPS
    per_rank = [
        [interpolate(measured["micro_batch_s"], n) for n in epoch_micro_batches(tokens, group_keys, r, ranks, run)]
        for r in range(ranks)
    ]
    steps = len(per_rank[0]) // accum
    if steps == 0:
        raise ValueError(f"{len(tokens)} rows make no optimizer step of {ranks} ranks x {run.MICRO_BATCH} x {accum}")
    step_s = [max(sum(times[s * accum : (s + 1) * accum]) for times in per_rank) for s in range(steps)]
    # DDP overlaps the all-reduce with the slowest rank's last backward; what sticks out is exposed
    last = [max(times[(s + 1) * accum - 1] for times in per_rank) for s in range(steps)]
    exposed = sum(max(0.0, allreduce_s - BACKWARD_SHARE * t) for t in last) if ranks > 1 else 0.0
    every = run.SAVE_EVERY
    saves = 1 + (sum(1 for s in range(1, steps) if s % every == 0) if every else 0)  # SAVE_EVERY, and the epoch end
    train_s = sum(step_s) + steps * measured["optimizer_s"] + exposed
    epoch_s = train_s + saves * measured["save_s"]
    epochs = run.EPOCHS if not run.MAX_STEPS else min(run.EPOCHS, run.MAX_STEPS / steps)
    total_s = epochs * epoch_s
    return {
        "gpus_per_node": gpus_per_node,
        "nodes": nodes,
        "steps_per_epoch": steps,
        "epochs": epochs,  # a fraction where MAX_STEPS ends the run first: it differs by configuration
        "total_steps": round(epochs * steps),
        "epoch_s": epoch_s,
        "step_s": train_s / steps,  # as the trainer's step_time_s: no checkpoint
        "straggler_s": max(
            0.0, sum(step_s) - sum(map(sum, per_rank)) / ranks
        ),  # waiting for the slowest rank, per epoch
        "allreduce_exposed_s": exposed,
        "total_s": total_s,
        "gpu_hours": total_s * ranks / 3600,
    }


def launch_to_adapter(measured: dict, prediction: dict, tokens: list[int], eval_tokens: list[int], run) -> dict:
    """The whole run's wall time for `prediction`'s configuration, in parts: start (imports, tokenizing,
    loading), first steps (train_ddp.settle_buckets' micro-batch of the first rows, plus each measured length's
    first-step extra once), training (predict's total_s), evaluation, the adapter save. tokens: as for predict();
    eval_tokens: every row's token count in EVAL_PATH.

    A length's first step is slower by the kernels it is the first to need: Triton's JIT (ffpa, inductor),
    torch.compile's graphs (the second width recompiles them dynamic), cuDNN plans. Each is built once per process
    and cached on disk, not once per width: the 12B's eager job on a fresh H200 paid 6.6 s in step 1 and 1.1 s
    in step 2, and no later step of its 29 widths took over 2.8 s against 2.23 (bench_results/issue25/call6)."""
    ranks = prediction["gpus_per_node"] * prediction["nodes"]
    compile_s = sum(  # each length's first step beyond its steady step
        max(0.0, measured["first_step_s"][n] - run.ACCUM_STEPS * s) for n, s in measured["micro_batch_s"].items()
    )
    settle = padded(max(tokens[: run.MICRO_BATCH]), run.PAD_TO_MULTIPLE)
    every, steps = run.EVAL_EVERY, prediction["total_steps"]
    evaluations = ((steps // every if every else 0) + (1 if not every or steps % every else 0)) if eval_tokens else 0
    eval_pass_s = (
        max(  # each rank its shard in file order; the all-reduce at the end waits for the slowest
            sum(
                interpolate(measured["forward_s"], padded(max(shard[i : i + run.MICRO_BATCH]), run.PAD_TO_MULTIPLE))
                for i in range(0, len(shard), run.MICRO_BATCH)
            )
            for shard in (eval_tokens[r::ranks] for r in range(ranks))
        )
        if evaluations
        else 0.0
    )
    parts = {
        "start_s": measured["imports_s"] + measured["tokenize_s"] + measured["load_s"],
        "first_steps_s": interpolate(measured["micro_batch_s"], settle) + compile_s,
        "training_s": prediction["total_s"],
        "evaluation_s": evaluations * eval_pass_s + (measured["eval_first_extra_s"] if evaluations else 0.0),
        "final_save_s": measured["adapter_save_s"],
    }
    return {**parts, "evaluations": evaluations, "run_s": sum(parts.values())}


def measure(run, device, tokenizer, quantile_rows: dict, warmup: int, steps: int, eval_rows: dict) -> dict:
    """Seconds per micro-batch at each quantile row's length and of each length's first step, the optimizer step,
    one checkpoint and one adapter save, loading the model; peak GiB per length; the forward pass alone at each
    eval quantile row's length (`eval_rows`, {} without EVAL_PATH). `run`: train_ddp's settings, planned."""
    import torch
    import torch.distributed as dist

    import train_ddp as T
    from collate import PadCollate
    from packing import PackCollate

    torch.manual_seed(run.SEED)
    start = time.perf_counter()
    peft_model = T.add_lora(T.load_model(run, device), run)
    load_s = time.perf_counter() - start
    T.init_distributed(device, tempfile.gettempdir(), run.DIST_INIT_TIMEOUT_S)
    model = T.wrap_ddp(T.CausalLMLoss(peft_model, run.CE_CHUNK_TOKENS, compiled=run.COMPILE_LAYERS), device)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=run.LR, fused=device.type == "cuda")
    if run.OPTIMIZER_OFFLOAD:  # its state's trips to the host and back are part of each step
        T.optimizer_state_on_host(optimizer)
    collate = (
        PackCollate(tokenizer.pad_token_id, run.MAX_LEN)
        if run.PACKING
        else PadCollate(tokenizer.pad_token_id, run.PAD_TO_MULTIPLE, run.MAX_LEN)
    )
    # the optimizer step alone; its state exists from here on, so each length's peak below includes it (with
    # OPTIMIZER_OFFLOAD it waits on the host, as in training)
    for p in params:
        p.grad = torch.zeros_like(p)  # zero gradients, no weight decay: the weights do not move
    optimizer.step()
    start = T.synchronized_clock(device)
    for _ in range(steps):
        optimizer.step()
    optimizer_s = (T.synchronized_clock(device) - start) / steps
    optimizer.zero_grad(set_to_none=True)
    result = {"micro_batch_s": {}, "first_step_s": {}, "forward_s": {}, "peak_gib": {}, "oom": []}
    result.update(optimizer_s=optimizer_s, load_s=load_s)
    for name, row in quantile_rows.items():
        batch = collate([row] * run.MICRO_BATCH)
        length = batch["input_ids"].shape[1]
        if result["oom"]:  # lengths ascend: a longer one fails too (and DDP's reducer is left mid-step)
            result["oom"].append(f"{name} ({length} tokens)")
            continue
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        print(f"measuring {name}: {length} tokens, {warmup} warm-up + {steps} timed steps ...", end=" ", flush=True)
        seconds = []
        try:
            for _ in range(warmup + steps):
                start = T.synchronized_clock(device)
                T.forward_backward(model, [batch] * run.ACCUM_STEPS, device)
                torch.nn.utils.clip_grad_norm_(params, run.GRAD_CLIP or math.inf)
                optimizer.zero_grad(set_to_none=True)  # no update: the weights stay the same for every length
                seconds.append(T.synchronized_clock(device) - start)
        except torch.OutOfMemoryError:
            print("out of memory", flush=True)
            result["oom"].append(f"{name} ({length} tokens)")
            continue
        result["micro_batch_s"][length] = sum(seconds[warmup:]) / (steps * run.ACCUM_STEPS)
        result["first_step_s"].setdefault(length, seconds[0])  # two quantiles of one width: the first saw it new
        print(f"{sum(seconds):.1f} s", flush=True)
        if device.type == "cuda":
            result["peak_gib"][length] = torch.cuda.max_memory_allocated() / 2**30
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    result["eval_first_extra_s"] = 0.0  # each eval length's first pass beyond its second (compile in eval mode)
    eval_collate = PadCollate(tokenizer.pad_token_id, run.PAD_TO_MULTIPLE, run.MAX_LEN)
    for row in eval_rows.values():  # as train_ddp.evaluate runs it: no gradients, eval mode
        batch = T.on_device(eval_collate([row] * run.MICRO_BATCH), device)
        seconds = []
        for _ in range(2):
            start = T.synchronized_clock(device)
            with torch.no_grad(), T.autocast(device):
                model.module(**batch)
            seconds.append(T.synchronized_clock(device) - start)
        result["forward_s"][batch["input_ids"].shape[1]] = seconds[1]
        result["eval_first_extra_s"] += max(0.0, seconds[0] - seconds[1])
    model.train()
    progress = {"epoch": 0, "step": 1, "step_in_epoch": 1}
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        T.save_checkpoint(model, optimizer, progress, {}, out, keep=1)
        result["save_s"] = time.perf_counter() - start
        start = time.perf_counter()
        T.save_adapter(model, {}, progress, out)
        result["adapter_save_s"] = time.perf_counter() - start
    dist.destroy_process_group()
    return result


def writable_file(text: str) -> str:
    """An argparse type: a file this can write, checked before minutes of measuring (not after)."""
    path = Path(text)
    existed = path.exists()
    try:
        path.open("a").close()  # "a": an existing report is not emptied by a run that fails later
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {text}: {e.strerror}") from None
    if not existed:
        path.unlink()
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--gpus-per-node", type=memory_budget.count, nargs="+", default=[1, 8], help="GPUs per node to predict for"
    )
    ap.add_argument("--nodes", type=memory_budget.count, nargs="+", default=[1], help="node counts to predict for")
    ap.add_argument("--bus-bw-gbps", type=memory_budget.positive, default=100.0, help="all-reduce bus bandwidth, GB/s")
    ap.add_argument(
        "--rows",
        type=memory_budget.count,
        default=5000,
        help="rows tokenized for the length distribution (evenly spaced; the longest added)",
    )
    ap.add_argument(
        "--warmup",
        type=memory_budget.bounded(int, 0),
        default=2,
        help="untimed steps per length (allocator, kernel choice)",
    )
    ap.add_argument("--steps", type=memory_budget.count, default=3, help="timed steps per length")
    ap.add_argument("--json", type=writable_file, help="also write the report's numbers to this file")
    args = ap.parse_args(argv)
    # a count given twice is one configuration: one row for it, in the order given
    args.gpus_per_node, args.nodes = list(dict.fromkeys(args.gpus_per_node)), list(dict.fromkeys(args.nodes))
    began = time.perf_counter()  # the imports the job makes too (here once torch is imported: near 0)
    import train_ddp  # torch, transformers and the trainer's own modules

    imports_s = time.perf_counter() - began
    try:
        report(args, imports_s)
    except train_ddp.InputError as e:  # the data, MODEL_ID's tokenizer, a setting: one line, as the trainer says it
        raise SystemExit(f"error: {e}") from None


def report(args: argparse.Namespace, imports_s: float) -> None:
    """Measure on this machine's first device, model every configuration of `args`, print the tables."""
    import torch

    import train_ddp as T
    from chat_data import ChatDataset, tokenize_conversation
    from packing import rows_of_epoch

    T.rank_info()  # rank 0 of 1: the measurement runs on one device
    device = T.rank_device(0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run, _ = T.plan(*T.checked_settings(), 1, device)  # the trainer's own start, checks first
    tokenizer, conversations, eval_conversations = T.read_conversations(run)

    def fillable(samples: int) -> tuple[list, dict]:
        """(nodes, GPUs per node) the data fill an optimizer step of, by the trainer's rule; the others, said."""
        configs, skipped = [], {}
        for nodes in args.nodes:
            for gpus in args.gpus_per_node:
                try:
                    T.steps_per_epoch(samples, gpus * nodes, run)
                    configs.append((nodes, gpus))
                except T.InputError as e:  # said now, not after minutes of measuring
                    skipped[f"{nodes} x {gpus}"] = line = f"skipped {nodes} x {gpus} ({gpus * nodes} ranks): {e}"
                    print(line, flush=True)
        if not configs:
            raise SystemExit(
                f"{run.DATA_PATH}: {samples} {'packed rows' if run.PACKING else 'rows'} fill no optimizer step of "
                f"{', '.join(skipped)} (nodes x GPUs per node); {FEWER}"
            )
        return configs, skipped

    if not run.PACKING:  # packed rows are known only once the lengths are
        configs, skipped = fillable(len(conversations))
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)  # plain python takes every core; torchrun's ranks take one each
        print(
            "CPU: 1 thread, as torchrun gives each rank (set OMP_NUM_THREADS to change); times do NOT transfer to GPUs"
        )
    n = len(conversations)
    chars = ChatDataset(conversations, tokenizer, run.MAX_LEN, run.ASSISTANT_ONLY_LOSS).lengths  # no tokenizing
    stride = max(1, n // args.rows)  # every row, or an evenly spaced sample of --rows
    longest = chars.index(max(chars))  # sampled too: the longest length's peak memory is measured on it
    # the file modelled: each sampled row stands for the `stride` rows from it on, the longest for itself
    stands_for = [i if i == longest else i - i % stride for i in range(n)]
    began = time.perf_counter()
    rows = {
        i: tokenize_conversation(tokenizer, conversations[i], run.MAX_LEN, run.ASSISTANT_ONLY_LOSS)
        for i in sorted(set(stands_for))
    }
    tokenize_row_s = (time.perf_counter() - began) / len(rows)
    eval_rows = [tokenize_conversation(tokenizer, c, run.MAX_LEN, run.ASSISTANT_ONLY_LOSS) for c in eval_conversations]
    eval_tokens = [len(r["input_ids"]) for r in eval_rows]
    lengths = sorted(len(r["input_ids"]) for r in rows.values())
    targets = sum(sum(label != -100 for label in r["labels"][1:]) for r in rows.values()) / sum(lengths)
    quantile_rows = at_quantiles(list(rows.values()))
    tokens, group_keys = [len(rows[i]["input_ids"]) for i in stands_for], [chars[i] for i in stands_for]
    mode = "unpacked rows (PACKING=0)"
    if run.PACKING:  # the trainer's packed rows, all MAX_LEN wide: one row of real conversations is measured
        packed = rows_of_epoch(tokens, run.SEED, 0, run.MAX_LEN)
        configs, skipped = fillable(len(packed))
        fill = sum(tokens) / (len(packed) * run.MAX_LEN)
        mode = f"packed rows (PACKING=1): {n:,} rows in {len(packed):,} of MAX_LEN, fill {fill:.1%}"
        quantile_rows = {"packed row": [rows[stands_for[i]] for i in packed[len(packed) // 2]]}
        tokens = group_keys = [run.MAX_LEN] * len(packed)
    eval_quantile_rows = at_quantiles(eval_rows) if eval_rows else {}
    measured = measure(run, device, tokenizer, quantile_rows, args.warmup, args.steps, eval_quantile_rows)
    measured.update(imports_s=imports_s, tokenize_s=tokenize_row_s * (n + len(eval_tokens)))
    if not measured["micro_batch_s"]:
        raise SystemExit(f"every measured length ran out of memory ({measured['oom']}): lower MEMORY_TARGET_GIB")

    source = run.MODEL_CONFIG or run.MODEL_ID
    shapes, config = memory_budget.param_shapes_from_path(source), memory_budget.load_config(source)
    predictions = []
    for nodes, gpus in configs:
        world = gpus * nodes
        allreduce = memory_budget.estimate_run(run, shapes, config, world, bus_bw_gbps=args.bus_bw_gbps)
        allreduce = allreduce["allreduce_seconds"] if world > 1 else 0
        prediction = predict(measured, tokens, group_keys, run, gpus, nodes, allreduce)
        prediction["whole_run"] = launch_to_adapter(measured, prediction, tokens, eval_tokens, run)
        predictions.append(prediction)

    machine = "times do NOT transfer to GPUs" if device.type == "cpu" else torch.cuda.get_device_name()
    added = ", and the one with the most characters" if longest % stride else ""
    sampled = f" of {len(rows):,} sampled rows (1 in {stride}{added})" if stride > 1 else ""
    print(
        f"time budget on {device.type} ({machine}) | {source} | {n:,} rows; lengths{sampled} p10/p50/p90/max "
        f"{'/'.join(str(quantile(lengths, q)) for q in QUANTILES.values())} tokens (MAX_LEN={run.MAX_LEN}); "
        f"targets {100 * targets:.0f}% of tokens | micro-batch {run.MICRO_BATCH} x {run.ACCUM_STEPS} | "
        f"ATTENTION_KERNEL={run.ATTENTION_KERNEL} | {mode}"
    )
    print("measured, per micro-batch:\n| length | seconds | tokens/s per GPU | peak alloc GiB |\n|---|---|---|---|")
    for length, seconds in sorted(measured["micro_batch_s"].items()):
        peak = measured["peak_gib"].get(length)
        peak = f"{peak:.1f}" if peak else "n/a"
        print(f"| {length} | {seconds:.3f} | {run.MICRO_BATCH * length / seconds:,.0f} | {peak} |")
    for name in measured["oom"]:
        print(f"| {name} | out of memory: such batches would stop the run; lower MAX_LEN or MEMORY_TARGET_GIB |")
    print(f"optimizer step {measured['optimizer_s']:.3f} s, checkpoint save {measured['save_s']:.2f} s (measured)")
    stop = f" or MAX_STEPS={run.MAX_STEPS} steps, whichever ends first" if run.MAX_STEPS else ""
    print(f"modelled, EPOCHS={run.EPOCHS}{stop}:")
    print(
        "| nodes x GPUs | steps/epoch | steps run (epochs) | step s | waiting for the slowest rank | "
        "exposed all-reduce | epoch | to completion | GPU-hours |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for p in predictions:
        print(
            f"| {p['nodes']} x {p['gpus_per_node']} | {p['steps_per_epoch']} | {p['total_steps']} "
            f"({p['epochs']:.3g}) | {p['step_s']:.2f} | {p['straggler_s']:.1f} s | {p['allreduce_exposed_s']:.1f} s | "
            f"{p['epoch_s'] / 60:.1f} min | {p['total_s'] / 3600:.2f} h | {p['gpu_hours']:.2f} |"
        )
    print("launch to adapter (the job's last line says its own):")
    print(
        "| nodes x GPUs | start: imports, tokenizing, loading | first steps (compile, cold cache) | training | "
        "evaluation | adapter save | launch to adapter |\n|---|---|---|---|---|---|---|"
    )
    for p in predictions:
        w = p["whole_run"]
        print(
            f"| {p['nodes']} x {p['gpus_per_node']} | {w['start_s']:.1f} s | {w['first_steps_s']:.1f} s "
            f"| {w['training_s'] / 60:.1f} min | {w['evaluation_s']:.1f} s "
            f"({w['evaluations']} x) | {w['final_save_s']:.1f} s | {w['run_s'] / 60:.1f} min |"
        )
    for line in skipped.values():  # again, below the table
        print(line)
    if args.json:
        report = {"measured": measured, "predictions": predictions, "tokens": tokens, "target_fraction": targets}
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
