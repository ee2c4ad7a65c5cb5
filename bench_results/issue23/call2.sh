# Issue 23, GPU call 2 (nvidia-h200, 1 GPU, one call): the done-when table. bench.py on the 12B architecture, 8 rows or
# samples per step, steps 2..8: fixed-length 2,048-token synthetic rows (the reference), packed rows of the realistic
# mix (fast-compile and fast eager), packed rows of the short mix, then TRL 1.16 SFTTrainer packing="bfd" on the
# realistic mix (8 rows of 2,048 per step, steps 2..6).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
python3 tools/make_chat_mix.py /tmp/mix.jsonl 2000
python3 tools/make_chat_mix.py /tmp/short.jsonl 4000 --short
B="python3 bench.py --steps 8 --run-timeout 150"
timeout 160 $B --runs fast-compile --out $OUT/fixed > $OUT/fixed.out 2>&1; echo "fixed: exit $?"
timeout 300 $B --runs fast-compile,fast --data /tmp/mix.jsonl --set PACKING=1 --out $OUT/packed-mix > $OUT/packed-mix.out 2>&1; echo "packed mix: exit $?"
timeout 160 $B --runs fast-compile --data /tmp/short.jsonl --set PACKING=1 --out $OUT/packed-short > $OUT/packed-short.out 2>&1; echo "packed short: exit $?"
timeout 200 python3 bench_results/issue23/trl_packed.py /tmp/mix.jsonl /tmp/trl --steps 6 > $OUT/trl.out 2>&1; echo "trl: exit $?"
for f in fixed packed-mix packed-short; do grep -A4 "^| run" $OUT/$f.out; done
tail -n 1 $OUT/trl.out
