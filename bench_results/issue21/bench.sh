# Device call for issue 21 (nvidia-h200, one GPU): bench.py RUN on 1 GPU, before the reshaping (commit 7d855f6, a copy
# in .before/, carried) and after it (this commit), one after the other, each alone on the GPU. 12B architecture,
# random weights, 2,048-token rows, 8 samples per step, steady steps 2..6.
#   bash bench_results/issue21/bench.sh RUN [SIDES]   (RUN: plain or fast-compile; SIDES: the order, default "before after";
#   a side named twice runs twice, as before-1/after-2 ... in $OUT)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
RUN=$1; i=0
for side in ${2:-before after}; do
  i=$((i+1)); dir=.; [ $side = before ] && dir=.before; name=$side-$i-$RUN
  (cd $dir && timeout 290 python3 bench.py --runs $RUN --run-timeout 280 --out $OUT/$name > $OUT/$name.out 2>&1)
  echo "== $name ($dir): exit $?"; tail -n 1 $OUT/$name.out
done
