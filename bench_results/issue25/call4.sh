# Session 7, GPU call 4 of issue 25 (nvidia-h200, 1 GPU): the new GPU test
# tests/test_train_ddp.py::test_short_rows_beside_long_ones_give_finite_gradients_on_gpu with the current code (must
# pass), then with lm_loss's right_padded branch taken out, i.e. the padding mask back (must fail).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
export PYTHONUNBUFFERED=1
T="timeout 330 python3 -m pytest -q -m gpu tests/test_train_ddp.py -k finite -p no:cacheprovider"
$T > $OUT/with-fix.out 2>&1; echo "== with the fix (must pass): exit $?"
python3 - <<'PY'
s = open("lm_loss.py").read()
i = s.index("        elif right_padded:")
j = s.index("            attention_mask = None\n", i) + len("            attention_mask = None\n")
open("lm_loss.py", "w").write(s[:i] + s[j:])
PY
$T > $OUT/without-fix.out 2>&1; echo "== without the fix (must fail): exit $?"
git checkout lm_loss.py 2>/dev/null
for f in with-fix without-fix; do grep -E "^(E  |FAILED|[0-9]+ (passed|failed))" $OUT/$f.out | tail -4 | cut -c1-300; done
