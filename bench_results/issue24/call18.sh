# Session 9, GPU call 18 (nvidia-h200, 1 GPU): A/B of train_ddp.garbage_collection_at_step_ends on one machine.
# Frugal (24.5 GiB, compiled), 8 steps: first with Python's automatic GC as before (gc_auto/sitecustomize.py
# makes gc.disable and gc.freeze do nothing), then as committed (GC only at step ends and epoch starts).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
PYTHONPATH=bench_results/issue24/gc_auto:$PYTHONPATH timeout 150 python3 bench.py --steps 8 --run-timeout 145 --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b1 > $OUT/bench-gc-auto.out 2>&1; echo "== frugal, automatic GC: exit $?"
timeout 150 python3 bench.py --steps 8 --run-timeout 145 --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b2 > $OUT/bench-gc-step-ends.out 2>&1; echo "== frugal, GC at step ends: exit $?"
cat /tmp/b1/bench.log /tmp/b2/bench.log > $OUT/bench.log
for f in /tmp/b1 /tmp/b2; do echo "== $f"; grep -E "^step" $f/bench.log | cut -d"|" -f1,9,14; done
tail -n 1 $OUT/bench-gc-auto.out; tail -n 1 $OUT/bench-gc-step-ends.out
