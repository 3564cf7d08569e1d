"""The target's p on the server agrees with the device's processed distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgespec.cloud.sampling import Sampling, target_probs
from edgespec.edge.sampling import SamplingParams, probs_from_logits


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.9), (0.8, 20, 0.5), (2.0, 1, 1.0)],
)
def test_cloud_and_edge_distributions_agree(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 64, generator=gen) * 3
    cloud = target_probs(logits, Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
    for row in range(logits.shape[0]):
        edge = probs_from_logits(logits[row].numpy(), SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
        np.testing.assert_allclose(cloud[row].numpy(), edge, atol=1e-6)
        assert ((cloud[row] > 0).numpy() == (edge > 0)).all()


def test_top_p_boundary_keeps_the_smallest_set():
    logits = torch.tensor([[0.5, 0.3, 0.2]]).log()
    probs = target_probs(logits, Sampling(temperature=1.0, top_p=0.8))
    assert (probs[0] > 0).tolist() == [True, True, False]


def test_top_k_keeps_exactly_k_on_ties():
    probs = target_probs(torch.zeros(1, 10), Sampling(temperature=1.0, top_k=3))
    assert int((probs > 0).sum()) == 3


@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)])
def test_invalid_sampling_is_refused(kwargs):
    with pytest.raises(ValueError):
        Sampling(**kwargs)
