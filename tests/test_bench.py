"""bench.py's launcher: a run that saved its adapter but never exits is named, ended with its children and
counted as a failure; a run that exits is not."""

import argparse
import math
import re
import sys
import time
from argparse import Namespace

import pytest
from conftest import ROOT, alive, wait_until

import bench

# A stand-in job: it "trains" (writes the adapter folder), then, like a rank waiting forever on workers
# that never end, keeps running with a child of its own.
JOB = """
import os, subprocess, sys, time
os.makedirs(os.path.join(sys.argv[1], "adapter"))
if sys.argv[2] == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"child {child.pid}", flush=True)
    time.sleep(600)
"""


def launch(tmp_path, mode: str):
    args = Namespace(exit_timeout=1.0, run_timeout=60)
    return bench.launch([sys.executable, "-c", JOB, str(tmp_path), mode], {}, tmp_path, args, tmp_path / "out.log")


def test_a_run_that_trains_and_then_does_not_exit_is_named_and_ended_with_its_children(tmp_path):
    t0 = time.monotonic()
    assert launch(tmp_path, "hang") == "then did not exit within 1 s"
    assert time.monotonic() - t0 < 10
    child = int(re.search(r"child (\d+)", (tmp_path / "out.log").read_text())[1])
    # SIGKILL is delivered at once, but the kernel tears the orphaned child down a moment later.
    assert wait_until(lambda: not alive(child), timeout=5.0)


def test_a_run_that_exits_after_training_is_not_a_failure(tmp_path):
    assert launch(tmp_path, "exit") is None


def test_attention_flops_count_each_token_inside_its_own_conversation():
    for n, span in [(1, 4), (5, 4), (2048, 1024), (700, math.inf)]:
        assert bench.causal_span_sum(n, span) == sum(min(t + 1, span) for t in range(n))
    config = str(ROOT / "configs" / "gemma-4-12b.json")
    flops = {n: bench.train_flops_per_token(config, [n]) for n in (512, 1536, 2048)}
    both = bench.train_flops_per_token(config, [512, 1536])  # one packed row of two conversations
    assert both == pytest.approx((512 * flops[512] + 1536 * flops[1536]) / 2048)  # each token in its own
    assert both < flops[2048]  # fewer keys than one conversation of 2,048


def test_scaling_is_each_runs_tokens_per_s_over_gpus_times_its_own_at_one_gpu():
    def run(name, gpus, tok_s=None, failed=None):
        return {
            "name": name,
            "gpus": gpus,
            "failed": failed,
            **({"step_s": 1.0, "target_tok_s": tok_s} if tok_s else {}),
        }

    results = [
        run("plain", 1, 1000.0),
        run("plain", 4, 2800.0),  # SPEC's example: 70%
        run("fast", 1, 3000.0),
        run("fast", 4, failed="OOM"),
        run("odd", 2, 1400.0, failed="exit 1"),  # measured steps, then failed: nobody's reference
        run("odd", 4, 1400.0),  # its 1-GPU reference: none
    ]
    bench.compare(results)
    assert [r.get("scaling") for r in results] == [None, 0.7, None, None, None, None]  # N > 1 only
    assert [r.get("vs_base") for r in results] == [1.0, 1.0, 3.0, None, None, 0.5]  # over the first name's, per N


def test_gpu_counts_are_a_list_of_positive_counts():
    assert bench.gpu_counts("1,2,2,4") == [1, 2, 4]
    for bad in ("0", "1,x", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="GPU counts >= 1"):
            bench.gpu_counts(bad)
