"""rloo.op_counts: what it counts as a view and as a host sync."""

from __future__ import annotations

import torch

from rloo.op_counts import OpCounts


def test_views_are_counted_apart_from_the_ops_that_launch_kernels() -> None:
    x = torch.arange(12.0).reshape(3, 4)
    with OpCounts() as counts:
        y = x.t()[1:].unsqueeze(0)  # three views
        z = (y * 2).sum()  # two kernels
        x[:, :1].copy_(x[:, 1:2])  # two slices (views) and an in-place copy: a write is no view
        float(z)  # a host sync
    assert counts.views == {"t": 1, "slice": 3, "unsqueeze": 1}
    assert counts.non_view_ops == counts.total_ops - 5 == 4  # mul, sum, copy_, _local_scalar_dense
    assert counts.syncs == {"_local_scalar_dense": 1}
