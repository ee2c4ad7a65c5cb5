# Issue 24, GPU call 6 (nvidia-h200, 1 GPU, one run at a time), at the commit whose offload gives the layer input back
# with its requires_grad (call 5's frugal compiled runs failed without it). 12B, 2,048-token rows, 8 samples/step:
# frugal compiled (the layout planned for 25 GiB: micro 1, every layer checkpointed and offloaded, chunk 256), what
# is live at its peak, and the same layout with 64-token loss chunks.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
B="python3 bench.py --steps 6 --run-timeout 120"
timeout 130 $B --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b/frugal-compile > $OUT/frugal-compile.out 2>&1; echo "== frugal-compile: exit $?"
timeout 130 python3 bench_results/issue24/memory_peak.py MEMORY_TARGET_GIB=25 COMPILE_LAYERS=1 > /tmp/b/memory_peak.log 2>&1; echo "== memory_peak: exit $?"
grep -A40 "^settings:" /tmp/b/memory_peak.log > $OUT/memory_peak.out
timeout 130 $B --runs offload-chunk64 --set COMPILE_LAYERS=1 --out /tmp/b/chunk64-compile > $OUT/chunk64-compile.out 2>&1; echo "== chunk64-compile: exit $?"
tar czf $OUT/logs.tgz -C /tmp/b .
cut -c1-250 $OUT/memory_peak.out
for name in frugal-compile chunk64-compile; do grep "^   {" $OUT/$name.out | cut -c1-400; tail -n 1 $OUT/$name.out; done
