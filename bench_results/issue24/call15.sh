# Session 8, GPU call 15 (nvidia-h200, 1 GPU): why frugal's steps vary (call 14: 3.88 to 5.55 s; call 13, 25 GiB
# without the activation offload: 3.82 to 4.70 s) while fast-compile's do not (1.946 to 1.963 s). Frugal (24.5 GiB,
# compiled), 10 steps, step 4 profiled: bench_results/issue25/step_profile.py gives the step's span against the
# GPU's busy time (idle = waiting on the host), and the kernel table is in bench.log.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
timeout 330 python3 bench.py --steps 10 --run-timeout 300 --runs frugal --set COMPILE_LAYERS=1 --set PROFILE_STEP=4 --out /tmp/b > $OUT/bench.out 2>&1; echo "== bench: exit $?"
cp /tmp/b/bench.log $OUT/bench.log
python3 bench_results/issue25/step_profile.py /tmp/b/frugal > $OUT/step_profile.txt 2>&1; echo "== step_profile: exit $?"
cat $OUT/step_profile.txt
grep -E "^step" /tmp/b/bench.log | cut -d'|' -f1,9
tail -n 1 $OUT/bench.out
