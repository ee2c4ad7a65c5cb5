"""Run a command, stamp every output line, and say when it exited: wall time, and the seconds from its last
line until every process holding its output (a rank's loader workers too) was gone.

    python bench_results/gpu-lane/timed_job.py LOG -- torchrun --standalone --nproc_per_node=2 train_ddp.py
"""

import subprocess
import sys
import time

log, cmd = sys.argv[1], sys.argv[sys.argv.index("--") + 1 :]
start = time.monotonic()
last = start
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
with open(log, "w") as f:
    for line in proc.stdout:  # ends when the last process holding the pipe has ended
        last = time.monotonic()
        f.write(f"{last - start:7.1f} {line}")
gone = time.monotonic()
proc.wait()
print(
    f"exit {proc.returncode} | wall {gone - start:.1f} s | last line at {last - start:.1f} s | "
    f"all processes gone {gone - last:.1f} s after it | {' '.join(cmd)}"
)
