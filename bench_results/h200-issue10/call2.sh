# Device call 2 (nvidia-h200-x2): the table of issue 10 on the 12B architecture, 2,048 tokens, 8 samples per GPU
# per step, steps 2..6, default kernel (ffpa; plain runs SDPA): plain and fast (compiled) on GPU 0 beside frugal
# and a profiled fast run on GPU 1, then fast on both GPUs. Writes under $OUT/call2.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
O=$OUT/call2; mkdir -p $O
B="python3 bench.py --steps 6 --run-timeout 220"
( CUDA_VISIBLE_DEVICES=0 timeout 290 $B --runs plain,fast-compile --out $O/gpu0 > $O/gpu0.out 2>&1 ) &
( CUDA_VISIBLE_DEVICES=1 timeout 145 $B --runs frugal --out $O/gpu1 > $O/gpu1.out 2>&1
  CUDA_VISIBLE_DEVICES=1 timeout 145 $B --runs fast-compile --set PROFILE_STEP=4 --out $O/profile > $O/profile.out 2>&1 ) &
wait
timeout 200 $B --gpus 2 --runs fast-compile --out $O/gpus2 > $O/gpus2.out 2>&1
grep -h "^| [a-z]" $O/*.out
