"""Data parallel, 3 ranks under torchrun; every so many steps rank 0 broadcasts the data pipeline's config with broadcast_object_list, an instance of a class from the team's featurespec package. Rank 1's node has an older image without that package: unpickling the object raises ModuleNotFoundError on rank 1 alone, and the others go on to the next all_reduce.
EXPECT kind=rank_failed culprit=1 ranks=3 launch=torchrun class=crash
"""
import os
import random
import sys
import tempfile
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank != 1:  # the package is installed everywhere but on rank 1's node
    pkg = tempfile.mkdtemp()
    with open(os.path.join(pkg, "featurespec.py"), "w") as f:
        f.write("class FeatureSpec:\n    def __init__(self, fields):\n        self.fields = fields\n")
    sys.path.insert(0, pkg)
reload_at = random.Random(int(os.environ.get("CORPUS_SEED", "0"))).randint(60, 160)
g = torch.zeros(2048)
for step in range(reload_at + 300):
    if step == reload_at:
        if rank == 0:
            import featurespec
            spec = [featurespec.FeatureSpec(["tokens", "mask"])]
        else:
            spec = [None]
        if rank == 1:
            print(f"FAULT {time.time():.6f} rank 1: receives a FeatureSpec it cannot unpickle (no featurespec package on its node)", flush=True)
        dist.broadcast_object_list(spec, src=0)
    g.normal_()
    dist.all_reduce(g)
    time.sleep(0.015)
dist.destroy_process_group()
