"""The agent's collective wrappers' pure parts: a rooted collective's root as a global rank
(the wrapped calls themselves run in real gloo jobs: tests/integration/test_corpus.py's
broadcast_src_mismatch)."""

import inspect

import torch.distributed as dist

from pgdash_agent.collective_wrappers import ROOTS, _root
from pgdash_agent.collectives import GroupTrack


def root_of(op, *args, **kwargs):
    params = list(inspect.signature(getattr(dist, op)).parameters)
    name, gname = ROOTS[op]
    track = GroupTrack("1", None, "gloo", ranks=[4, 6, 7])  # global ranks of group ranks 0-2
    return _root(track, args, kwargs, params.index(name) if name in params else None, name,
                 params.index(gname) if gname in params else None, gname)


def test_a_root_is_the_global_rank_given_or_the_group_rank_translated():
    assert root_of("broadcast", "tensor", 6) == 6  # src, by position
    assert root_of("broadcast", "tensor", src=7) == 7
    assert root_of("broadcast", "tensor", group_src=1) == 6  # group rank 1 is global 6
    assert root_of("reduce", "tensor", dst=4) == 4
    assert root_of("gather", "tensor", group_dst=2) == 7
    assert root_of("scatter", "tensor", None, 4) == 4


def test_no_root_or_a_negative_one_reports_none():
    assert root_of("broadcast", "tensor") is None
    assert root_of("broadcast", "tensor", src=-1) is None
    assert root_of("broadcast", "tensor", group_src=9) == 9  # outside the group: as given
