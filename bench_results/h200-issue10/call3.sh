# Device call 3 (nvidia-h200-x2): the GPU lane with SAVE_ON_SIGTERM on (its new default) and the attention
# kernels' exactness tests, beside a profiled step of the fast layout on GPU 1 (kernel table only).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
O=$OUT/call3; mkdir -p $O; W=$(mktemp -d)
( CUDA_VISIBLE_DEVICES=1 timeout 200 python3 bench.py --steps 4 --run-timeout 190 --runs fast-compile --set PROFILE_STEP=3 --out $W/profile > $O/profile.out 2>&1
  grep -B2 -A40 "Self CUDA %" $W/profile/bench.log | head -60 > $O/profile_kernels.txt ) &
timeout 500 python3 -m pytest -m gpu -n 2 -v -s --durations=0 --junitxml=$O/gpu_lane.xml -p no:cacheprovider > $O/gpu_lane.log 2>&1
wait
tail -3 $O/gpu_lane.log; grep -E "FAILED|ERROR" $O/gpu_lane.log | head
