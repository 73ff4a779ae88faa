"""A one-rank gloo job whose agent samples a stand-in NVML that reports XID 79 (no GPU here)."""

import time

import torch
import torch.distributed as dist

from pgdash_agent.config import AgentConfig
from pgdash_agent.core import Agent
from tests.helpers.fake_nvml import FakeNvml  # the job runs with PYTHONPATH at the checkout

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
