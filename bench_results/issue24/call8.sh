# Issue 24, GPU call 8 (nvidia-h200, 1 GPU): on branch issue24-checkpoint-around-compile, where frugal compiled ran
# in call 7 (3,732 target tok/s, 24.67 GiB against 24.27 predicted) but memory_peak.py's allocation history broke
# the compiled recompute. What allocation pushes frugal compiled past 24.45 GiB (memory_peak.py --trap).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 170 python3 bench_results/issue24/memory_peak.py --trap 24.45 MEMORY_TARGET_GIB=25 COMPILE_LAYERS=1 > $OUT/trap.log 2>&1; echo "== trap 24.45: exit $?"
grep -v "^\s*$" $OUT/trap.log | grep -A80 "^trap at" | cut -c1-220 | head -120
