# Device call 1 (nvidia-h200-x2): the GPU exactness test of attention.py's kernels, then the global layers'
# kernel inside the real step (bench.py's fast-compile layout, 12B, 2,048 tokens): ffpa, flex, sdpa.
# GPU 0 and GPU 1 run side by side. Writes under $OUT/call1.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
O=$OUT/call1; mkdir -p $O
python3 -c "import torch, ffpa_attn, transformers, peft, triton; print(torch.__version__, 'ffpa', ffpa_attn.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'triton', triton.__version__)" > $O/versions.txt 2>&1
BENCH="python3 bench.py --runs fast-compile --steps 6 --run-timeout 220 --set ATTENTION_KERNEL"
( export CUDA_VISIBLE_DEVICES=0
  [ -n "$SKIP_EXACTNESS" ] || timeout 150 python3 -m pytest -m gpu tests/test_attention.py -v -s -p no:cacheprovider > $O/exactness.log 2>&1
  timeout 250 $BENCH=ffpa --out $O/ffpa > $O/ffpa.out 2>&1 ) &
( export CUDA_VISIBLE_DEVICES=1
  timeout 250 $BENCH=flex --out $O/flex > $O/flex.out 2>&1
  timeout 250 $BENCH=sdpa --out $O/sdpa > $O/sdpa.out 2>&1 ) &
wait
grep -h "fast-compile |" $O/*.out
