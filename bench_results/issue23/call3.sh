# GPU call 3 (nvidia-h200, 1 GPU): the 12B-shape attention GPU tests at this commit (after their refactor), then the
# 80 GB layout's throughput on an H200 (issue 22's README row: MEMORY_TARGET_GIB=75 COMPILE_LAYERS=1, 12B, 2,048 tokens).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -m gpu -s -p no:cacheprovider tests/test_attention.py > $OUT/gpu_attention_tests.txt 2>&1; echo "attention GPU tests: exit $?"
timeout 150 python3 bench.py --runs fast-compile --set MEMORY_TARGET_GIB=75 --steps 8 --run-timeout 140 --out $OUT/layout80 > $OUT/layout80.out 2>&1; echo "80 GB layout: exit $?"
grep -E "relative errors|passed|failed" $OUT/gpu_attention_tests.txt
grep -A3 "^| run" $OUT/layout80.out
