# Session 10, GPU call 22 at 960816b (nvidia-h200, 1 GPU; nvidia-h200-x2 not lent all session), at the session's final code.
# 1. The GPU tests on one GPU (python -m pytest -m gpu: the 2-GPU NCCL tests skip themselves): the job's start
#    changed (launch environment checked, the process group formed with a one-line failure, the settings compared
#    across ranks as the first collective, on NCCL an all_gather_object).
# 2. fast-compile (8 steps) and frugal (24.5 GiB, compiled, 8 steps), one after the other: both targets in one lease.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
start=$(date +%s)
timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -q -rA --durations=0 > $OUT/gpu-1gpu.log 2>&1; echo "== pytest -m gpu on 1 GPU: exit $? in $(( $(date +%s) - start )) s"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/gpu-1gpu.log | tail -15
timeout 360 python3 bench.py --steps 8 --run-timeout 175 --runs fast-compile,frugal --set COMPILE_LAYERS=1 --out /tmp/b1 > $OUT/bench.out 2>&1; echo "== bench fast-compile, frugal: exit $?"
cp /tmp/b1/bench.log $OUT/bench.log
grep -E "^step|^=====" /tmp/b1/bench.log | cut -d"|" -f1,9,14 | cut -c1-120
tail -n 4 $OUT/bench.out
