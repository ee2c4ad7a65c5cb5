cd /tmp/stress
export PATH=/tmp/pyspy/bin:$PATH
for i in 1 2 3; do
  echo "== round $i $(date +%T)"
  .venv/bin/python -m pytest -x -q -p no:cacheprovider tests/test_recovery.py tests/test_train_ddp.py tests/test_guards.py > /tmp/stress-$i.log 2>&1
  echo "exit $? $(date +%T)"; tail -3 /tmp/stress-$i.log
done
