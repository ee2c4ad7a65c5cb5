# Session 9, GPU call 16 (nvidia-h200, 1 GPU, one run at a time; nvidia-h200-x2 not lent).
# 1. The GPU tests that changed since the lane's last pass and run on one GPU: the attention tests (the sliding
#    window's, now checking with the profiler that the flash kernels ran, eager and compiled) and the
#    optimizer-offload unit test on CUDA.
# 2. Frugal (24.5 GiB, compiled), 8 steps: as is, then with Python's garbage collector off (gc_off/sitecustomize.py)
#    to see whether GC pauses are part of its host-bound step's spread.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu tests/test_attention.py -p no:cacheprovider -rA > $OUT/gpu-attention.out 2>&1; echo "== gpu attention tests: exit $?"
timeout 100 python3 -m pytest -q -m gpu tests/test_train_ddp.py -k optimizer_state -p no:cacheprovider > $OUT/gpu-offload.out 2>&1; echo "== optimizer offload test: exit $?"
timeout 170 python3 bench.py --steps 8 --run-timeout 160 --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b1 > $OUT/bench-base.out 2>&1; echo "== bench frugal: exit $?"
PYTHONPATH=bench_results/issue24/gc_off:$PYTHONPATH timeout 170 python3 bench.py --steps 8 --run-timeout 160 --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b2 > $OUT/bench-gc-off.out 2>&1; echo "== bench frugal gc off: exit $?"
cat /tmp/b1/bench.log /tmp/b2/bench.log > $OUT/bench.log
grep -E "passed|failed" $OUT/gpu-attention.out | tail -3; tail -n 1 $OUT/gpu-offload.out
for f in /tmp/b1 /tmp/b2; do echo "== $f"; grep -E "^step" $f/bench.log | cut -d"|" -f1,9,14; done
tail -n 3 $OUT/bench-base.out; tail -n 3 $OUT/bench-gc-off.out
