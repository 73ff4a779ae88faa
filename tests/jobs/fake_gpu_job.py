"""A one-rank gloo job whose agent samples a stand-in NVML that reports XID 79 (no GPU here)."""

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from fake_nvml import FakeNvml  # noqa: E402

from pgdash_agent.config import AgentConfig  # noqa: E402
from pgdash_agent.core import Agent  # noqa: E402

nvml = FakeNvml()
nvml.xids = [79]
agent = Agent(AgentConfig.from_env(interval_s=0.2), nvml=nvml,
              gpu_locator=lambda: "0000-fake").start()
dist.init_process_group("gloo")
for _ in range(3):
    dist.all_reduce(torch.ones(1))
time.sleep(1.5)  # a few GPU readings
dist.destroy_process_group()
assert agent.detach(), agent.stats()
