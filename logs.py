"""What a run tells its user: rank 0's console lines, metrics.jsonl, TensorBoard and the profiler.

- say(): the one rank-0 print (through tqdm, so the progress bar stays intact).
- StepLog: each step's loss, throughput and memory; the memory model checked once against the real peak.
- profiled(): torch.profiler around one step.
- seconds_since_launch(): the process's age, for the run's wall time in its last line.
"""

import contextlib
import functools
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch


def is_rank0() -> bool:
    """RANK from torchrun's environment (also before the process group exists); no RANK: one process."""
    return os.environ.get("RANK", "0") == "0"


@contextmanager
def output_kept(stream):
    """Writes to `stream` (stdout, stderr) that cannot fail the job: once its terminal has closed (EIO, the
    SIGHUP that stops the job gracefully) or its reader has gone (EPIPE, `| tee` killed), the stream's
    descriptor points at /dev/null, and the step or its checkpoint goes on."""
    try:
        yield
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


def say(msg: str) -> None:
    """Print on rank 0 only, the line and its newline in one write: the ranks share torchrun's pipe, and a
    peer's line written between the two would land mid-line (guards.to_stderr)."""
    if is_rank0():
        from tqdm import tqdm

        with output_kept(sys.stdout):
            tqdm.write(msg + "\n", file=sys.stdout, end="")
            sys.stdout.flush()


def seconds_since_launch() -> float:
    """Wall seconds since this process started (Linux's /proc: Python's and torch's imports included), the
    reference time_budget.py's whole-run prediction is checked against; elsewhere, since this module's import."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: start, in ticks since boot
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def where_everything_is(output_dir: str, adapter: Path, model_id: str, model_config: str) -> str:
    """The run's files (checkpoints only if some were saved) and how to load the adapter: on MODEL_ID's weights,
    unless it was trained on MODEL_CONFIG's random ones."""
    out = Path(os.path.abspath(output_dir))  # from any folder (a relative OUTPUT_DIR is relative to where the job ran)
    checkpoints = f"checkpoints: {out / 'checkpoints'}   " if (out / "checkpoints").is_dir() else ""
    load = (
        f"load it: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({model_id!r}), {str(adapter)!r})"
        if not model_config
        else f"trained on random weights built from MODEL_CONFIG={model_config!r}: a benchmark's adapter, no model's"
    )
    return (
        f"adapter: {adapter}   metrics: {out / 'metrics.jsonl'}   {checkpoints}settings: {out / 'config.json'}\n{load}"
    )


class StepLog:
    """Rank 0's record of each step (metrics.jsonl, TensorBoard, the console and the progress bar), with
    the memory model checked once against the real peak, at step 3 (AdamW state and allocator caches exist):
    predict_peak_gib(longest padded length so far) is memory_budget.py's prediction."""

    MEMORY_CHECK_STEP = 3

    def __init__(
        self, output_dir: str, log_every: int, total_steps: int, done: int, device, predict_peak_gib, packed_slots=0
    ):
        """packed_slots: with packing, the token slots of one step (rows x MAX_LEN, all ranks): "fill" is logged."""
        from tqdm import tqdm

        self.output_dir, self.log_every, self.total_steps, self.device = output_dir, log_every, total_steps, device
        self.packed_slots = packed_slots
        self.predict_peak_gib, self.longest = predict_peak_gib, 0
        self.rank0 = is_rank0()
        self.steps, self.skipped = 0, {}  # this process's steps; {step: why} of those that applied no update
        self.bar = tqdm(
            total=total_steps,
            initial=done,
            desc="train",
            dynamic_ncols=True,
            disable=not self.rank0 or not sys.stderr.isatty(),
        )

    def step(self, step, epoch, loss_sum, counts, grad_norm, lr, skipped, step_time, data_wait, micro_batches):
        """`skipped`: why this step applied no update (train_ddp.optimizer_step), or None."""
        self.bar.update(1)
        self.steps += 1
        if skipped:
            self.skipped[step] = skipped
        self.longest = max(self.longest, *(b["input_ids"].shape[1] for b in micro_batches))
        check_memory = self.device.type == "cuda" and step == self.MEMORY_CHECK_STEP
        logged = (self.log_every and step % self.log_every == 0) or step == self.total_steps or check_memory
        logged = logged or bool(skipped)  # a dropped update is never silent, whatever LOG_EVERY
        if not self.rank0 or not logged:
            return
        n_targets, n_tokens, n_padded = counts
        record = {
            "step": step,
            "epoch": epoch,
            "loss": loss_sum / n_targets if n_targets else None,  # no target: no loss (not a loss of 0)
            "grad_norm": grad_norm,
            "lr": lr,
            "skipped": bool(skipped),
            "tokens_per_s": n_tokens / step_time,
            "target_tokens_per_s": n_targets / step_time,
            "step_time_s": step_time,
            "targets": int(n_targets),
            "tokens": int(n_tokens),
            "padding": 1 - n_tokens / n_padded,
            **({"fill": n_tokens / self.packed_slots} if self.packed_slots else {}),
            "data_wait_s": data_wait,
        }
        if self.device.type == "cuda":
            record["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
            record["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
            if check_memory:
                try:  # a diagnostic: it never stops the training
                    record["predicted_peak_gib"] = self.predict_peak_gib(self.longest)
                except Exception as e:
                    say(f"warning: no memory prediction ({type(e).__name__}: {e})")
        self.write(record)
        loss = "-" if record["loss"] is None else f"{record['loss']:.4f}"
        self.bar.set_postfix(loss=loss, tok_s=f"{record['tokens_per_s']:.0f}")
        say(" | ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))

    def eval(self, step: int, result: dict, final: bool = False) -> None:
        if self.rank0:
            self.write({"step": step, **result})
        when = "final" if final else f"step {step}"
        if result["eval_targets"] == 0:
            say(f"warning: eval | {when} | no target tokens: MAX_LEN cuts every answer in EVAL_PATH; no loss")
        else:
            say(f"eval | {when} | loss {result['eval_loss']:.4f} | ppl {result['eval_ppl']:.2f}")

    def saved(self, step: int, what: str, since: float) -> float:
        """A save (a checkpoint or the adapter) that started at time.perf_counter() `since` has ended: its seconds,
        also in metrics.jsonl as "save_s" (SPEC: time spent saving)."""
        seconds = time.perf_counter() - since
        if self.rank0:
            self.write({"step": step, "saved": what, "save_s": seconds})
        return seconds

    def write(self, record: dict) -> None:
        """One JSON line in metrics.jsonl, and the numbers to TensorBoard when it is installed."""
        path, line = Path(self.output_dir) / "metrics.jsonl", (json.dumps(record) + "\n").encode()
        with open(path, "ab", buffering=0) as f:
            whole = f.tell()
            try:
                while line:
                    line = line[f.write(line) :]
            except OSError as e:  # a full disk: no half line left for the next run to append to
                with contextlib.suppress(OSError):  # (a file system turned read-only keeps it)
                    f.truncate(whole)
                raise OSError(e.errno, e.strerror, str(path)) from e  # named: reported as OUTPUT_DIR's failure
        writer = tensorboard_writer(self.output_dir)
        if writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                    tag = f"{key}/{record['saved']}" if "saved" in record else key  # the last step saves twice
                    writer.add_scalar(tag, value, record["step"])
            writer.flush()

    def close(self) -> None:
        """Ends the progress bar; says how many of this run's steps applied no update, and why."""
        self.bar.close()
        for why in dict.fromkeys(self.skipped.values()):
            steps = [step for step, reason in self.skipped.items() if reason == why]
            shown = ", ".join(map(str, steps[:10])) + (", ..." if len(steps) > 10 else "")
            say(f"warning: {len(steps)} of {self.steps} steps skipped their update ({why}): steps {shown}")


@functools.cache
def tensorboard_writer(output_dir: str):
    """OUTPUT_DIR/tensorboard (tensorboard --logdir OUTPUT_DIR); None without the optional tensorboard package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(Path(output_dir) / "tensorboard"))


@contextmanager
def profiled(active: bool, device: torch.device, trace: Path):
    """torch.profiler around one step: the top kernels on rank 0 and a Chrome trace per rank in `trace` (look
    for NCCL kernels running under the backward compute of the last micro-batch)."""
    if not active:
        yield
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        yield
    prof.export_chrome_trace(str(trace))
    say(prof.key_averages().table(sort_by=f"{'cuda' if device.type == 'cuda' else 'cpu'}_time_total", row_limit=30))
