# Device call for issue 21 (nvidia-h200-x2): bench.py plain on 1 GPU, before (7d855f6, .before/, carried) and after
# (this commit) SIDE BY SIDE, each alone on its GPU, then again with the GPUs swapped. 12B architecture, random
# weights, 2,048-token rows, 8 samples per step, steady steps 2..6.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
RUN=${1:-plain}
for round in 1 2; do
  [ $round = 1 ] && gb=0 ga=1 || gb=1 ga=0
  (cd .before && CUDA_VISIBLE_DEVICES=$gb timeout 200 python3 bench.py --runs $RUN --run-timeout 190 --out $OUT/before-r$round-gpu$gb > $OUT/before-r$round-gpu$gb.out 2>&1) &
  (CUDA_VISIBLE_DEVICES=$ga timeout 200 python3 bench.py --runs $RUN --run-timeout 190 --out $OUT/after-r$round-gpu$ga > $OUT/after-r$round-gpu$ga.out 2>&1) &
  wait
done
for f in $OUT/*.out; do echo "$(basename $f .out): $(grep "^| $RUN " $f)"; done
