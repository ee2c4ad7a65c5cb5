# Session 8, GPU call 13 (nvidia-h200, 1 GPU, one run at a time; nvidia-h200-x2 not lent), at fcf17f2.
# OPTIMIZER_OFFLOAD (AdamW's state in pinned host memory between steps):
# 1. its GPU test (bitwise the same steps, state pinned on the host between steps, also after a resume);
# 2. frugal compiled at MEMORY_TARGET_GIB=24.5: the planner now picks every layer checkpointed, inputs and AdamW
#    state on the host, loss chunks of 256 (predicted 23.7 GiB); the target is <= 24.5 GiB at >= 3,500;
# 3. MEMORY_TARGET_GIB=25 compiled: the planner's new pick there (checkpointing with inputs on the GPU, AdamW state
#    on the host, predicted 24.4 GiB), for its speed.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 120 python3 -m pytest -q -m gpu tests/test_train_ddp.py -k host_takes -p no:cacheprovider > $OUT/gpu-test.out 2>&1; echo "== gpu test: exit $?"
B="python3 bench.py --steps 6 --run-timeout 220"
timeout 240 $B --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b/frugal-compile > $OUT/frugal-compile.out 2>&1; echo "== frugal-compile (24.5): exit $?"
timeout 240 $B --runs frugal --set COMPILE_LAYERS=1 --set MEMORY_TARGET_GIB=25 --out /tmp/b/frugal25-compile > $OUT/frugal25-compile.out 2>&1; echo "== frugal25-compile: exit $?"
tar czf $OUT/logs.tgz -C /tmp/b .
tail -n 2 $OUT/gpu-test.out
for name in frugal-compile frugal25-compile; do grep -h "MEMORY_TARGET_GIB=.*predicted\|OPTIMIZER_OFFLOAD" /tmp/b/$name/bench.log | head -3 | cut -c1-300; tail -n 1 $OUT/$name.out; done
