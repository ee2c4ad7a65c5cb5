# Issue 24, GPU call 1 (nvidia-h200, 1 GPU): the attention GPU tests (the sliding layers of right-padded rows now on
# flex with a sliding-window block mask), then the real fast-compile step (12B, 2,048-token rows, 8 samples/step)
# in three trees, each run alone on the GPU: .before24 (bc44e34, main), .ce24 (75e6e75: the fused chunked loss),
# . (75e6e75 + the sliding flex lever, uncommitted at the time of the call).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 150 python3 -m pytest -q -m gpu -s tests/test_attention.py > $OUT/gpu_attention_tests.txt 2>&1; echo "attention gpu tests exit $?"
for tree in .before24 .ce24 .; do
  name=$(case $tree in .before24) echo base;; .ce24) echo fused-ce;; .) echo fused-ce+sliding-flex;; esac)
  (cd $tree && timeout 170 python3 bench.py --runs fast-compile --steps 8 --run-timeout 160 --out $OUT/$name > $OUT/$name.out 2>&1; echo "== $name: exit $?")
done
grep -E "passed|failed|errors vs" $OUT/gpu_attention_tests.txt
for name in base fused-ce fused-ce+sliding-flex; do echo "## $name"; tail -n 2 $OUT/$name.out; done
