# Issue 24, GPU call 9 (nvidia-h200, 1 GPU), branch issue24-checkpoint-around-compile. Call 8's trap at 24.45 GiB
# (frugal compiled) hit in a compiled layer's backward with ~0.36 GiB of live blocks not explained by weights,
# adapter state or that layer (8 x 16 MiB, 8 x 8 MiB, ...). This time the trap also lists the CUDA tensors Python
# holds, and the allocation history is tried with context="alloc" (call 7's context="all" broke the recompute).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 150 python3 bench_results/issue24/memory_peak.py --trap 24.45 MEMORY_TARGET_GIB=25 COMPILE_LAYERS=1 > $OUT/trap.log 2>&1; echo "== trap 24.45: exit $?"
HISTORY_CONTEXT=alloc timeout 200 python3 bench_results/issue24/memory_peak.py MEMORY_TARGET_GIB=25 COMPILE_LAYERS=1 > $OUT/history.log 2>&1; echo "== history (alloc): exit $?"
grep -A60 "^| Python-held" $OUT/trap.log | cut -c1-200 | head -60
grep -A40 "^settings:" $OUT/history.log | cut -c1-250; tail -3 $OUT/history.log | cut -c1-300
