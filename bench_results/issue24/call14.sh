# Session 8, GPU call 14 (nvidia-h200, 1 GPU, one run at a time; nvidia-h200-x2 not lent).
# The sliding layers of right-padded rows on FlashAttention-2's native window (attention.SlidingWindowFlash, with
# ATTENTION_KERNEL=ffpa, which auto picks here):
# 1. the GPU attention tests (the new ones: eager and compiled against the FP32 masked reference, no graph break)
#    and the finite-gradient test of the realistic mix (short rows beside long ones: padding past the window);
# 2. fast-compile and frugal (24.5 GiB, compiled), 6 steps each, one after the other.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu tests/test_attention.py -p no:cacheprovider -rA > $OUT/gpu-attention.out 2>&1; echo "== gpu attention tests: exit $?"
timeout 150 python3 -m pytest -q -m gpu tests/test_train_ddp.py -k finite -p no:cacheprovider > $OUT/gpu-finite.out 2>&1; echo "== finite-gradient test: exit $?"
timeout 470 python3 bench.py --steps 6 --run-timeout 220 --runs fast-compile,frugal --set COMPILE_LAYERS=1 --out /tmp/b > $OUT/bench.out 2>&1; echo "== bench: exit $?"
cp /tmp/b/bench.log $OUT/bench.log
grep -E "passed|failed|relative errors" $OUT/gpu-attention.out | tail -8; tail -n 2 $OUT/gpu-finite.out
grep -h "MEMORY_TARGET_GIB=.*predicted\|settings (planner)" /tmp/b/bench.log | cut -c1-250
tail -n 4 $OUT/bench.out
