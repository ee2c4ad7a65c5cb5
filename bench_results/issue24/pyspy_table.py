"""Where the training loop's main thread spends its time, from py-spy's raw stacks (call21.sh):

    python bench_results/issue24/pyspy_table.py frugal.stacks[.gz] [TOP]

The main thread of the process whose stacks reach train_ddp.forward_backward. Its samples inside
forward_backward are split into torch.compile's compilation (dynamo's convert_frame, inductor's compile_fx),
backward (the thread waits while autograd's device thread recomputes and runs the backward: a C++ thread that
py-spy cannot see) and forward (the host work of the forward pass), with the forward's leaf frames: where it
was, C++ frames included when recorded with --native.
"""

import collections
import gzip
import re
import sys

LINE = re.compile(r'^process (\d+):"(.*?)";thread \((\d+)\): ([^;]*);?(.*) (\d+)$', re.S)


def frame_name(frame: str) -> str:
    """'forward (/x/y/train_ddp.py:412)' -> 'forward (train_ddp.py)' (line numbers and folders dropped)."""
    m = re.match(r"(.*) \((.*?)(:\d+)?\)$", frame)
    return f"{m.group(1)[:80]} ({m.group(2).rsplit('/', 1)[-1]})" if m else frame[:90]


def main() -> None:
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30
    text = (gzip.open(path, "rt") if path.endswith(".gz") else open(path)).read()
    # a record starts at 'process N:' (a command line may hold newlines)
    records = [m for r in re.split(r"\n(?=process \d+:)", text.strip()) if (m := LINE.match(r))]
    loop = collections.Counter(m.group(3) for m in records if "forward_backward (" in m.group(5))
    thread = loop.most_common(1)[0][0]
    parts, forward = collections.Counter(), collections.Counter()
    for m in records:
        frames, count = m.group(5).split(";"), int(m.group(6))
        if m.group(3) != thread or not any(f.startswith("forward_backward (") for f in frames):
            continue
        if any("convert_frame.py" in f or "compile_fx.py" in f for f in frames):
            parts["compiling"] += count
        elif any(f.startswith("_engine_run_backward (") for f in frames):
            parts["backward: waiting for autograd's device thread"] += count
        else:
            parts["forward"] += count
            forward[frame_name(frames[-1])] += count
    steady = sum(parts.values()) - parts["compiling"]
    print(
        f"thread {thread}, samples inside forward_backward\n| part | samples | % of the non-compiling |\n|---|---|---|"
    )
    for part, n in parts.most_common():
        print(f"| {part} | {n} | {100 * n / steady:.1f}% |" if part != "compiling" else f"| {part} | {n} | |")
    print("\n| forward: leaf frame | samples | % of the forward |\n|---|---|---|")
    for name, n in forward.most_common(top):
        print(f"| {name} | {n} | {100 * n / parts['forward']:.1f}% |")


if __name__ == "__main__":
    main()
