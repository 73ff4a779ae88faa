"""DDP-style script, 3 ranks under torchrun: rank 0 alone downloads and preprocesses the dataset before calling init_process_group (`if int(os.environ["RANK"]) == 0: prepare_data()`: 70-80 s of writing and reading files), while ranks 1 and 2 already wait for it in the rendezvous (torch's init timeout is 30 minutes); then training runs cleanly.
EXPECT kind=none ranks=3 launch=torchrun class=healthy tolerate=init_incomplete
"""
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist


def prepare_data(seconds):
    """Download shards and tokenize them: files written and read back, some CPU."""
    end = time.monotonic() + seconds
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "shard.bin")
        while time.monotonic() < end:
            with open(path, "wb") as f:
                f.write(os.urandom(1 << 20))
            with open(path, "rb") as f:
                data = f.read()
            torch.frombuffer(bytearray(data[:4096]), dtype=torch.uint8).float().mean()
            time.sleep(0.05)


rng = random.Random(int(os.environ.get("CORPUS_SEED", "0")))
if int(os.environ["RANK"]) == 0:
    print(f"MARK {time.time():.6f} rank 0: prepares the data before init_process_group",
          flush=True)
    prepare_data(rng.uniform(70.0, 80.0))
dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.zeros(1024)
for step in range(300):
    grad = torch.randn(1024)
    dist.all_reduce(grad)
    w -= 0.01 * grad
    time.sleep(0.015)
dist.destroy_process_group()
