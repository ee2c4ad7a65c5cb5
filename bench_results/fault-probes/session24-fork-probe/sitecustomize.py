import sys, threading, time, os
_t0 = time.monotonic()
def _hook(event, args):
    if event == "os.fork":
        names = [t.name for t in threading.enumerate()]
        tasks = []
        for t in os.listdir("/proc/self/task"):
            try: tasks.append(open(f"/proc/self/task/{t}/comm").read().strip())
            except OSError: pass
        sys.stderr.write(f"[audit pid {os.getpid()} {time.monotonic()-_t0:.2f}s] fork; python threads {names}; native {sorted(tasks)}\n")
sys.addaudithook(_hook)
