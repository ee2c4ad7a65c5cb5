# Issue 24, GPU call 7 (nvidia-h200, 1 GPU, one run at a time): for the next session, on branch
# issue24-checkpoint-around-compile (train_ddp.compile_and_checkpoint: checkpoint around each compiled layer, the
# shared_kv_states layers eager when checkpointed, dynamo's DDP graph splitting off, offload hooks that keep
# requires_grad). 12B, 2,048-token rows, 8 samples/step: frugal compiled (calls 5-6 failed with CheckpointError),
# what is live at its peak, frugal compiled with 64-token chunks, and fast-compile (unchanged path: no checkpoint).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
B="python3 bench.py --steps 6 --run-timeout 120"
timeout 130 $B --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b/frugal-compile > $OUT/frugal-compile.out 2>&1; echo "== frugal-compile: exit $?"
timeout 130 python3 bench_results/issue24/memory_peak.py MEMORY_TARGET_GIB=25 COMPILE_LAYERS=1 > /tmp/b/memory_peak.log 2>&1; echo "== memory_peak: exit $?"
grep -A40 "^settings:" /tmp/b/memory_peak.log > $OUT/memory_peak.out
timeout 130 $B --runs offload-chunk64 --set COMPILE_LAYERS=1 --out /tmp/b/chunk64-compile > $OUT/chunk64-compile.out 2>&1; echo "== chunk64-compile: exit $?"
timeout 150 $B --runs fast-compile --out /tmp/b/fast-compile > $OUT/fast-compile.out 2>&1; echo "== fast-compile: exit $?"
tar czf $OUT/logs.tgz -C /tmp/b .
cut -c1-250 $OUT/memory_peak.out
for name in frugal-compile chunk64-compile fast-compile; do grep "^   {" $OUT/$name.out | cut -c1-400; tail -n 1 $OUT/$name.out; done
