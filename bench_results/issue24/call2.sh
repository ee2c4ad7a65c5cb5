# Issue 24, GPU call 2 (nvidia-h200, 1 GPU), at 75e6e75 (the fused chunked loss; the sliding flex lever dropped):
# frugal (MEMORY_TARGET_GIB=25) on the 12B, 2,048-token rows, then one profiled fast-compile step (PROFILE_STEP=3:
# the kernel table of what is left, in fast-compile-profile/bench.log).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 150 python3 bench.py --runs frugal --steps 6 --run-timeout 140 --out $OUT/frugal > $OUT/frugal.out 2>&1; echo "== frugal: exit $?"
timeout 140 python3 bench.py --runs fast-compile --steps 4 --set PROFILE_STEP=3 --run-timeout 130 --out $OUT/fast-compile-profile > $OUT/fast-compile-profile.out 2>&1; echo "== fast-compile profiled: exit $?"
tail -n 2 $OUT/frugal.out
grep -A 40 "Self CPU %" $OUT/fast-compile-profile/bench.log | cut -c1-60,100-200 | head -45
