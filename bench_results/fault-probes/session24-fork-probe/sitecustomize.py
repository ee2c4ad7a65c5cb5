"""On PYTHONPATH of a job: at every os.fork, print the process's Python threads and its native threads' names."""

import os
import sys
import threading
import time

START = time.monotonic()


def native_threads() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{task}/comm").read().strip())
        except OSError:
            pass
    return sorted(names)


def hook(event, args):
    if event == "os.fork":
        python = [t.name for t in threading.enumerate()]
        sys.stderr.write(
            f"[audit pid {os.getpid()} {time.monotonic() - START:.2f}s] fork; python threads {python}; "
            f"native {native_threads()}\n"
        )


sys.addaudithook(hook)
