# Session 10, GPU call 21 (nvidia-h200, 1 GPU): call 20 again with native frames (py-spy --native: the C++ under
# each Python frame, e.g. kernel launches inside autograd's device thread), 50 Hz, 8 steps; the raw stacks come
# back gzipped (call 20's 46 MB did not come back) for pyspy_table.py here.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH || exit
export PYTHONUNBUFFERED=1
timeout 250 py-spy record --subprocesses --idle --threads --native --rate 50 --format raw -o /tmp/frugal.stacks -- \
  python3 bench.py --steps 8 --run-timeout 200 --runs frugal --set COMPILE_LAYERS=1 --out /tmp/b > $OUT/bench.out 2>&1
echo "exit $?"; tail -n 4 $OUT/bench.out
grep -E "^step" /tmp/b/bench.log | cut -d"|" -f1,9,14 | tr '\n' ';'; echo
gzip -c /tmp/frugal.stacks > $OUT/frugal.stacks.gz; ls -la $OUT
