# Issue 23, GPU call 1 (nvidia-h200, 1 GPU): packed attention kernels at 12B shapes, the GPU exactness test (and the
# same test with the conversation rule removed, which must fail), then the real step on the realistic mix, packed:
# this commit (flex) against the branch's previous commit (.before23: transformers' dense position_ids mask).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
python3 tools/make_chat_mix.py /tmp/mix.jsonl 2000
timeout 120 python3 bench_results/issue23/attention_kernels.py --rows 8 > $OUT/kernels.txt 2>&1; echo "kernels exit $?"
timeout 90 python3 -m pytest -q -m gpu -s tests/test_attention.py -k packed > $OUT/gpu_test.txt 2>&1; echo "gpu test exit $?"
cp -r . /tmp/broken && sed -i 's/return (conversation\[b, q\] == conversation\[b, kv\]) & (kv <= q)/return kv <= q/' /tmp/broken/attention.py
(cd /tmp/broken && timeout 90 python3 -m pytest -q -m gpu -s tests/test_attention.py -k packed > $OUT/gpu_test_broken.txt 2>&1; echo "gpu test, conversation rule removed: exit $? (must fail)")
for tree in . .before23; do
  name=$([ $tree = . ] && echo flex || echo dense-mask)
  (cd $tree && timeout 170 python3 bench.py --runs fast-compile --data /tmp/mix.jsonl --set PACKING=1 --steps 8 --run-timeout 160 --out $OUT/$name > $OUT/$name.out 2>&1; echo "== packed $name: exit $?")
done
tail -n 3 $OUT/gpu_test.txt $OUT/gpu_test_broken.txt | grep -v "^$"
cat $OUT/kernels.txt | tail -n 12
for name in flex dense-mask; do tail -n 2 $OUT/$name.out; done
