# The GPU tests on ONE GPU (python -m pytest -m gpu; the 2-GPU NCCL tests skip themselves): run when the 2-GPU kind
# is not lent, so that the job's code changed this session has at least run on CUDA and NCCL at world 1.
# Not the gate: that is bench_results/gpu-lane/lane.py on nvidia-h200-x2.
#   run(kind=nvidia-h200, carry=[".whl"]): bash bench_results/gpu-lane/one-gpu/call.sh
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
# the device's copy carries no current .git: the output folder is named by the commit the call ran at
start=$(date +%s)
timeout 280 python3 -m pytest -m gpu -p no:cacheprovider -q -rA --durations=0 > $OUT/gpu-1gpu.log 2>&1; echo "== pytest -m gpu on 1 GPU: exit $? in $(( $(date +%s) - start )) s"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/gpu-1gpu.log | tail -15
