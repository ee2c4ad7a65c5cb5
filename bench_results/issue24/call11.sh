# Issue 24, GPU call 11 (nvidia-h200, 1 GPU, one run at a time), branch issue24-checkpoint-around-compile: frugal
# compiled again with room for its compile time (call 7's run finished its 6 steps but passed --run-timeout 120),
# and frugal eager (the shipped default) in the same lease as its baseline.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
B="python3 bench.py --steps 6 --run-timeout 220"
timeout 240 $B --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b/frugal-compile > $OUT/frugal-compile.out 2>&1; echo "== frugal-compile: exit $?"
timeout 240 $B --runs frugal --out /tmp/b/frugal-eager > $OUT/frugal-eager.out 2>&1; echo "== frugal-eager: exit $?"
tar czf $OUT/logs.tgz -C /tmp/b .
for name in frugal-compile frugal-eager; do grep "^   {" $OUT/$name.out | cut -c1-400; tail -n 1 $OUT/$name.out; done
