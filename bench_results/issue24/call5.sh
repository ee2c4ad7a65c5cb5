# Issue 24, GPU call 5 (nvidia-h200, 1 GPU, one run at a time), at the commit that checkpoints around the compiled
# layer and gives memory_budget.py its compile terms. 12B, 2,048-token rows, 8 samples/step: frugal compiled (the
# layout the compiled model plans for 25 GiB), what is live at its peak (memory_peak.py), fast-compile (the planner
# now takes micro-batch 4 at 130 GiB), and fast-compile on packed rows of the realistic chat mix (issue 23's).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
B="python3 bench.py --steps 6 --run-timeout 130"
timeout 140 $B --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b/frugal-compile > $OUT/frugal-compile.out 2>&1; echo "== frugal-compile: exit $?"
timeout 150 python3 bench_results/issue24/memory_peak.py MEMORY_TARGET_GIB=25 COMPILE_LAYERS=1 > /tmp/b/memory_peak.log 2>&1; echo "== memory_peak: exit $?"
grep -A40 "^settings:" /tmp/b/memory_peak.log > $OUT/memory_peak.out
timeout 140 $B --runs fast-compile --out /tmp/b/fast-compile > $OUT/fast-compile.out 2>&1; echo "== fast-compile: exit $?"
python3 tools/make_chat_mix.py /tmp/mix.jsonl 2000
timeout 150 $B --runs fast-compile --data /tmp/mix.jsonl --set PACKING=1 --out /tmp/b/packed-mix > $OUT/packed-mix.out 2>&1; echo "== packed mix: exit $?"
tar czf $OUT/logs.tgz -C /tmp/b .
cat $OUT/memory_peak.out | cut -c1-250
for name in frugal-compile fast-compile packed-mix; do grep "^   {" $OUT/$name.out | cut -c1-400; tail -n 1 $OUT/$name.out; done
