# GPU probe for issue 23 (nvidia-h200, 1 GPU): fast-compile on the realistic mix, unpacked vs PACKING=1 (transformers'
# dense packed mask on the global layers: no kernel work yet), 12B architecture, 8 rows or samples per step.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
python3 bench_results/issue23/make_mix.py /tmp/mix.jsonl 2000
for packing in 0 1; do
  timeout 280 python3 bench.py --runs fast-compile --data /tmp/mix.jsonl --set PACKING=$packing --steps 8 --run-timeout 270 --out $OUT/packing$packing > $OUT/packing$packing.out 2>&1
  echo "== PACKING=$packing: exit $?"; tail -n 1 $OUT/packing$packing.out
done
