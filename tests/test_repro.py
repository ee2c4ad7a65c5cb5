"""Every repro/ script on 2 ranks (LANE_RANKS), on gloo (CPU) and on NCCL (GPU lane): each bug variant fails in
bounded time with its message and a SYMPTOM/CAUSE/FIX/SPOT IT summary; each fix exits 0. A bad numeric option is
refused by argparse before any process group starts; a bug mode that does not reproduce never claims a fix."""

import re
import subprocess
import sys
import time

import pytest
from conftest import BACKENDS, RANKS, ROOT, torchrun

REPRO = ROOT / "repro"
HANG = ("--timeout", 5)  # process-group timeout for the cases that would hang: the error comes after 5 s

# per-rank checksums printed by rank 0 on consecutive lines: rank 1's differs from rank 0's
DRIFT4 = r"rank 0: sha256 of all trained parameters (\w+)\n  rank 1: sha256 of all trained parameters (?!\1)\w+"
DRIFT5 = r"rank 0: all-reduces .* sha256 (\w+)\n  rank 1: all-reduces .* sha256 (?!\1)\w+"

# (script, args, patterns that must all appear in the output)
UNEVEN = r"batches per rank: \[3" + r", 2" * (RANKS - 1) + r"\]"  # rank 0 one batch more than the others
BUGS = [
    (
        "01_uneven_batches.py",
        HANG,
        [
            UNEVEN,
            r"Timed out",
            r"stuck in the gradient all-reduce of batch 3/3",
            r"stuck in the barrier after its 2 batches",
        ],
    ),
    (
        "02_unused_parameters.py",
        (),
        [
            r"step 1 ok",
            r"Expected to have finished reduction in the prior iteration",
            r"parameter indices without grad: \[\d+(, \d+){5}\]",
            r"embed_vision\.patch_dense\.lora_A",
            r"embed_audio\.embedding_projection\.lora_B",
        ],
    ),
    (
        "03_rank_divergent.py",
        ("--variant", "a", *HANG),
        [r"Timed out", r"stuck in all_reduce\(epoch_loss\) under `if rank == 0`"],
    ),
    ("03_rank_divergent.py", ("--variant", "b", *HANG), [r"Timed out", r"stuck in DDP's buffer broadcast"]),
    (
        "03_rank_divergent.py",
        ("--variant", "c", *HANG),
        [r"Timed out", r"left the loop at the NaN of step 2", r"stuck in the gradient all-reduce of step 2"],
    ),
    (
        "04_modified_after_wrap.py",
        ("--variant", "adapters"),
        [r"AFTER the DDP wrap", r"82 of 82 trained tensors differ", DRIFT4],
    ),
    (
        "04_modified_after_wrap.py",
        ("--variant", "unfreeze"),
        [r"AFTER the DDP wrap", r"1 of 83 trained tensors differ.*norm\.weight", DRIFT4],
    ),
    (
        "05_accumulation_sync.py",
        ("--variant", "a"),
        [r"per optimizer step \[4, 4, 4\]", r"12 all-reduces for 3 optimizer steps"],
    ),
    ("05_accumulation_sync.py", ("--variant", "b"), [r"per optimizer step \[0, 0, 0\]", r"replicas drifted", DRIFT5]),
    ("06_closure_collate.py", (), [r"Can't (pickle|get) local object 'make_collate.<locals>.collate'"]),
    ("07_all_ranks_write.py", (), [r"rank 0 reads back (a state no rank held|rank 1's state|an unreadable file)"]),
]
FIXES = [
    ("01_uneven_batches.py", ("--fix=sampler", *HANG), [r"batches per rank: \[2" + r", 2" * (RANKS - 1) + r"\]"]),
    ("01_uneven_batches.py", ("--fix=join", *HANG), [UNEVEN]),
    ("02_unused_parameters.py", ("--fix",), [r"OK \(--fix=scope\)", r"step 3 ok"]),
    ("02_unused_parameters.py", ("--fix=find_unused",), [r"OK \(--fix=find_unused\)", r"step 3 ok"]),
    ("03_rank_divergent.py", ("--variant", "a", "--fix", *HANG), [r"mean loss over ranks"]),
    ("03_rank_divergent.py", ("--variant", "b", "--fix", *HANG), [r"eval on rank 0"]),
    (
        "03_rank_divergent.py",
        ("--variant", "c", "--fix", *HANG),
        [r"\[rank 0\] .*left the loop at step 2", r"\[rank 1\] .*left the loop at step 2"],
    ),
    ("04_modified_after_wrap.py", ("--variant", "adapters", "--fix"), [r"0 of 82 trained tensors differ"]),
    ("04_modified_after_wrap.py", ("--variant", "unfreeze", "--fix"), [r"0 of 83 trained tensors differ"]),
    ("05_accumulation_sync.py", ("--fix",), [r"per optimizer step \[1, 1, 1\]", r"3 all-reduces for 3 steps"]),
    ("06_closure_collate.py", ("--fix",), [r"2 batches from 2 spawned workers"]),
    ("07_all_ranks_write.py", ("--fix",), [r"every rank read rank 0's state"]),
]
BOUND = 90  # seconds per launch, imports included; the hang cases error out after 5 s of waiting
NCCL_BOUND = 3 * 5 + 30  # the hang cases on NCCL: 3x --timeout, plus 30 s for start-up (CUDA, NCCL init)
# NCCL may match a stray collective silently instead of timing out, so its hang cases promise less than
# gloo's exact "Timed out" story: every rank reports where it stood, rank 0 explains.
NCCL_HANG = {
    "01": [UNEVEN, r"\[rank 0\] (stuck in|finished)", r"\[rank 1\] (stuck in|finished)"],
    "03": [r"\[rank 0\] (stuck in|reached)", r"\[rank 1\] (stuck in|reached)"],
}


def _id(case):
    return f"{case[0][:2]}{''.join(a for a in map(str, case[1]) if a.isalpha() or a.startswith('--fix'))}"


def _run(script, args, backend):
    t0 = time.monotonic()
    launch = torchrun(REPRO / script, *args, timeout=BOUND, backend=backend)
    return launch, time.monotonic() - t0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("script,args,patterns", BUGS, ids=[_id(c) for c in BUGS])
def test_bug_fails_fast_and_explains(script, args, patterns, backend, record_property):
    launch, seconds = _run(script, args, backend)
    record_property("exit_code", launch.returncode)
    record_property("seconds", round(seconds, 1))
    out = launch.output
    assert launch.returncode != 0, out[-4000:]
    if backend == "nccl" and script[:2] in NCCL_HANG:
        patterns = NCCL_HANG[script[:2]]
        assert seconds < NCCL_BOUND, f"took {seconds:.1f}s"
    assert seconds < BOUND
    for pattern in patterns:
        assert re.search(pattern, out), f"{pattern!r} not in output:\n{out[-4000:]}"
    for tag in ("SYMPTOM:", "CAUSE:", "FIX:", "SPOT IT:"):  # four lines, printed once (by rank 0)
        # not anchored at line starts: unbuffered ranks write a line and its newline separately, so
        # another rank's line can land in between
        assert len(re.findall(tag, out)) == 1, f"{tag} not printed exactly once:\n{out[-4000:]}"
    assert re.search(r"SYMPTOM:.*rank", out), "the summary must name the ranks involved"
    assert "--fix" in re.search(r"FIX:.*$", out, re.M).group(0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("script,args,patterns", FIXES, ids=[_id(c) for c in FIXES])
def test_fix_exits_zero(script, args, patterns, backend, record_property):
    launch, seconds = _run(script, args, backend)
    record_property("exit_code", launch.returncode)
    record_property("seconds", round(seconds, 1))
    out = launch.output
    assert launch.returncode == 0, out[-4000:]
    assert not re.search("SYMPTOM:|SPOT IT:", out) and "OK (" in out, out[-4000:]
    for pattern in patterns:
        assert re.search(pattern, out), f"{pattern!r} not in output:\n{out[-4000:]}"


# (script, option, a value it must refuse): every numeric option of every script
BAD_VALUES = [
    ("01_uneven_batches.py", "--timeout", "0"),
    ("02_unused_parameters.py", "--timeout", "-1"),
    ("03_rank_divergent.py", "--timeout", "nan"),
    ("04_modified_after_wrap.py", "--timeout", "inf"),
    ("05_accumulation_sync.py", "--accum", "1"),
    ("05_accumulation_sync.py", "--steps", "0"),
    ("05_accumulation_sync.py", "--timeout", "0.5"),
    ("06_closure_collate.py", "--workers", "0"),
    ("07_all_ranks_write.py", "--block", "0"),
    ("07_all_ranks_write.py", "--timeout", "x"),
]


@pytest.mark.parametrize("script,option,value", BAD_VALUES, ids=[f"{c[0][:2]}{c[1]}={c[2]}" for c in BAD_VALUES])
def test_bad_value_is_refused_up_front(script, option, value):
    # plain python, no torchrun: a script that got past argparse would fail in init_process_group with a traceback
    run = subprocess.run(
        [sys.executable, REPRO / script, option, value], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert run.returncode == 2 and not run.stdout, run.stdout + run.stderr
    usage, error = run.stderr.split(f"{script}: error: ")  # argparse: the usage, then one line naming the option
    assert usage.startswith("usage: ") and "Traceback" not in usage, run.stderr
    assert re.fullmatch(rf"argument {option}: .*{re.escape(value)}.*\n", error), run.stderr


# on one rank these bugs cannot show: the run must say so and exit non-zero, not print an OK meant for --fix
@pytest.mark.parametrize("script,args", [("01_uneven_batches.py", ()), ("05_accumulation_sync.py", ("--variant", "b"))])
def test_bug_mode_that_does_not_reproduce_says_so(script, args):
    launch = torchrun(REPRO / script, *args, nproc=1, timeout=BOUND)
    assert launch.returncode != 0 and "NOT REPRODUCED (" in launch.output, launch.output[-4000:]
    assert "OK (" not in launch.output and "(--fix" not in launch.output, launch.output[-4000:]
