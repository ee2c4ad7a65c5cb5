# Session 8, GPU call 7 (nvidia-h200, 1 GPU; nvidia-h200-x2 not lent): the packed mode on one GPU (x2_call.sh
# packed with GPUS=1: time_budget.py, then the job alone with cold caches, 60 steps), and issue 24's sliding-layer
# kernel measurement first (bench_results/issue24/sliding_kernels.py, 30 s).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 90 python3 bench_results/issue24/sliding_kernels.py --batch 4 > $OUT/sliding_kernels.txt 2>&1; echo "== sliding kernels: exit $?"
GPUS=1 bash bench_results/issue25/x2_call.sh packed  # (x2_call.sh as it was at 0bafd94: predict, then the jobs on $GPUS)
cat $OUT/sliding_kernels.txt | tail -8
