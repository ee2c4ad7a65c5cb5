# Session 9, GPU call 17 (nvidia-h200, 1 GPU, one run at a time; nvidia-h200-x2 not lent), at the commit with
# garbage_collection_at_step_ends (train_ddp: no automatic GC inside a step).
# 1. fast-compile (6 steps) and frugal (24.5 GiB, compiled, 8 steps), one after the other: both targets in one lease.
# 2. frugal again with inductor's C++ wrapper (TORCHINDUCTOR_CPP_WRAPPER=1: the compiled layers' kernels launched
#    from C++ rather than Python), to see how much of the host-bound step is the Python wrapper.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 390 python3 bench.py --steps 8 --run-timeout 190 --runs fast-compile,frugal --set COMPILE_LAYERS=1 --out /tmp/b1 > $OUT/bench.out 2>&1; echo "== bench fast-compile, frugal: exit $?"
TORCHINDUCTOR_CPP_WRAPPER=1 timeout 180 python3 bench.py --steps 8 --run-timeout 175 --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b2 > $OUT/bench-cpp-wrapper.out 2>&1; echo "== bench frugal cpp wrapper: exit $?"
cat /tmp/b1/bench.log > $OUT/bench.log; cat /tmp/b2/bench.log > $OUT/bench-cpp-wrapper.log
for f in /tmp/b1 /tmp/b2; do echo "== $f"; grep -E "^step|^=====" $f/bench.log | cut -d"|" -f1,9,14 | cut -c1-120; done
tail -n 4 $OUT/bench.out; tail -n 3 $OUT/bench-cpp-wrapper.out
