"""With STUCK_COLLATE=1: every data loader worker's third collate sleeps 600 s (the stuck-worker probe)."""

import os
import time

if os.environ.get("STUCK_COLLATE"):
    import torch.utils.data

    import collate

    original = collate.PadCollate.__call__
    calls = {"n": 0}

    def stuck(self, batch):
        if torch.utils.data.get_worker_info() is not None:
            calls["n"] += 1
            if calls["n"] > 2:
                time.sleep(600)
        return original(self, batch)

    collate.PadCollate.__call__ = stuck
