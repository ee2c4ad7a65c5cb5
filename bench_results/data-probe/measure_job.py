"""Check 4: run a command (a torchrun job), print its output with seconds since launch, and sample every process
of its tree (RSS and PSS, from /proc) until it exits: the peak per process, by role.

python bench_results/data-probe/measure_job.py -- CMD...
"""

import subprocess
import sys
import threading
import time

import psutil


def main() -> None:
    cmd = sys.argv[sys.argv.index("--") + 1 :]
    t0 = time.time()
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak: dict[int, list] = {}  # pid: [rss, pss, role, first seen]

    def sample() -> None:
        root = psutil.Process(job.pid)
        while job.poll() is None:
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            for p in procs:
                try:
                    mem = p.memory_full_info()
                    parent = p.parent()
                    role = " ".join(p.cmdline()[-2:])[-60:] + f" (parent {parent.pid if parent else '?'})"
                except psutil.Error:
                    continue
                old = peak.setdefault(p.pid, [0, 0, role, time.time() - t0])
                old[0], old[1] = max(old[0], mem.rss), max(old[1], mem.pss)
            time.sleep(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for line in job.stdout:
        print(f"[{time.time() - t0:7.1f}s] {line}", end="", flush=True)
    job.wait()
    sampler.join(2)
    print(f"exit {job.returncode} after {time.time() - t0:.1f} s; peaks (MiB) by process:")
    for pid, (rss, pss, role, seen) in sorted(peak.items()):
        print(f"  pid {pid:7d} rss {rss / 2**20:8.0f} pss {pss / 2**20:8.0f} from {seen:6.1f}s  {role}")


if __name__ == "__main__":
    main()
