# Issue 24's "fast on 2 GPUs" row and issue 26's 2-GPU scaling, on nvidia-h200-x2 in one call (about 6.5 min):
#   timeout 595 bash bench_results/issue24/x2_bench.sh
# Each run alone on its GPU(s): the fast and plain layouts at 1 then 2 GPUs; bench.py prints the scaling column
# (target tok/s at 2 GPUs over 2 x the same run's at 1). Writes $OUT/bench (bench.log, results.json) and $OUT/bench.out.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout 585 python3 bench.py --gpus 1,2 --runs fast-compile,plain --steps 6 --run-timeout 190 --out $OUT/bench > $OUT/bench.out 2>&1
echo "exit $?"; tail -8 $OUT/bench.out
