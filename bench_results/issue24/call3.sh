# Issue 24, GPU call 3 (nvidia-h200-x2, one run per GPU, side by side), at the final commit: fast-compile and frugal
# (12B, 2,048-token rows, 8 samples/step) with the fused loss chunk on log_softmax. The GPU lane follows in the next
# call of the same lease.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
(CUDA_VISIBLE_DEVICES=0 timeout 150 python3 bench.py --runs fast-compile --steps 8 --run-timeout 140 --out $OUT/fast-compile > $OUT/fast-compile.out 2>&1; echo "== fast-compile: exit $?") &
(CUDA_VISIBLE_DEVICES=1 timeout 150 python3 bench.py --runs frugal --steps 6 --run-timeout 140 --out $OUT/frugal > $OUT/frugal.out 2>&1; echo "== frugal: exit $?") &
wait
for name in fast-compile frugal; do tail -n 1 $OUT/$name.out; done
