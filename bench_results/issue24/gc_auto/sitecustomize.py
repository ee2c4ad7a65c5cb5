# Experiment only (call 18): undoes train_ddp.garbage_collection_at_step_ends (automatic collection stays on,
# nothing frozen), for an A/B against it on the same machine. Put this folder first on PYTHONPATH.
import gc

gc.disable = lambda: None
gc.freeze = lambda: None
