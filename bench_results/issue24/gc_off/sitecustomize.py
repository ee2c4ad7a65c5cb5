# Experiment only (call 16): Python's cyclic garbage collector off for the whole process, to see whether its
# pauses make frugal's host-bound steps vary (3.9 to 5.5 s in call 14). Put this folder first on PYTHONPATH.
import gc

gc.disable()
