# Session 10, GPU call 20 (nvidia-h200, 1 GPU; nvidia-h200-x2 not lent at the start).
# Where frugal's host time goes (call 15: the step is host-bound, 3.0 s of GPU work in 3.9-5.5 s steps):
# frugal (24.5 GiB, compiled), 10 steps, under py-spy (sampling the Python stacks of every process, 100 Hz,
# idle threads included), raw collapsed stacks to $OUT/frugal.stacks; analysed by pyspy_table.py.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
py-spy --version; py-spy dump --pid $$ > /dev/null 2>&1 && echo "ptrace ok" || echo "ptrace refused"
timeout 240 py-spy record --subprocesses --idle --threads --rate 100 --format raw -o $OUT/frugal.stacks -- \
  python3 bench.py --steps 10 --run-timeout 200 --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b > $OUT/bench.out 2>&1
echo "exit $?"; tail -n 4 $OUT/bench.out
grep -E "^step" /tmp/b/*/bench.log /tmp/b/bench.log 2>/dev/null | cut -d"|" -f1,9,14 | tr '\n' ';'; echo
ls -la $OUT; python3 bench_results/issue24/pyspy_table.py $OUT/frugal.stacks | tee $OUT/pyspy_table.txt
