"""The GPU lane, as the gate runs it on nvidia-h200-x2: `python -m pytest -m gpu -n 2`, bounded, with
LAST.txt (commit, command, counts, wall time) and the per-test table written to OUTDIR.

    python3 bench_results/gpu-lane/lane.py OUTDIR COMMIT [TIMEOUT_S [PART]]

PART is all (default), main (every GPU test but tests/test_repro.py) or repro (tests/test_repro.py alone): since
session 24 the whole lane no longer fits one 600-s device call, so it runs as main then repro, one call each.
"""

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

out, commit = Path(sys.argv[1]), sys.argv[2]
limit = float(sys.argv[3]) if len(sys.argv) > 3 else 540
part = sys.argv[4] if len(sys.argv) > 4 else "all"
select = {"all": [], "main": ["--ignore=tests/test_repro.py"], "repro": ["tests/test_repro.py"]}[part]
# -v: each test's outcome on its own line as it ends; unbuffered: a lane killed at its limit still shows them
cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-n", "2", "-p", "no:cacheprovider", "-v", "-rA"]
cmd += ["--durations=0", f"--junitxml={out / 'gpu_lane.xml'}", *select]
start = time.monotonic()
with open(out / "gpu_lane.log", "w") as log:
    try:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=limit, env=env).returncode
    except subprocess.TimeoutExpired:
        rc = f"killed after {limit:.0f} s"
wall = time.monotonic() - start

counts, rows = {"passed": 0, "failed": 0, "skipped": 0}, []
if (out / "gpu_lane.xml").exists():
    for case in ET.parse(out / "gpu_lane.xml").getroot().iter("testcase"):
        result = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        result = {"failure": "failed", "error": "failed"}.get(result, result)
        counts[result] += 1
        module = case.get("classname", "").split(".")[-1]
        rows.append(f"{module:<16} {case.get('name'):<100} {result:<8} {float(case.get('time', 0)):6.1f}")
last = (
    f"commit: {commit}\npart: {part}\ncommand: python -m pytest -m gpu -n 2   (run as: {' '.join(cmd[1:])})\n"
    f"machine: nvidia-h200-x2\nexit: {rc}\npassed: {counts['passed']}  failed: {counts['failed']}  "
    f"skipped: {counts['skipped']}\nwall: {wall:.0f} s\n"
)
(out / "LAST.txt").write_text(last)
(out / "table.txt").write_text("\n".join(rows) + "\n")
print("\n".join(rows) + "\n\n" + last)
