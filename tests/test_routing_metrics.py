"""rla.metrics.routing_mismatch against counts done by hand on small arrays."""

from __future__ import annotations

import numpy as np
import pytest

from rla.metrics import MetricsInputError, routing_mismatch


def test_routing_mismatch_counts():
    # 2 layers, 4 tokens, k=2
    a = np.array([[[0, 1], [2, 3], [4, 5], [6, 7]],
                  [[0, 1], [1, 0], [2, 3], [3, 4]]])
    b = np.array([[[0, 1], [3, 2], [4, 6], [6, 7]],   # token 1: same set, other order; token 2: other set
                  [[0, 1], [1, 0], [2, 3], [3, 5]]])  # token 3: other set
    wa = np.array([[[0.6, 0.4], [0.7, 0.3], [0.5, 0.5], [0.9, 0.1]],
                   [[0.5, 0.5], [0.8, 0.2], [0.6, 0.4], [0.7, 0.3]]])
    wb = np.array([[[0.6, 0.4], [0.25, 0.75], [0.5, 0.5], [0.8, 0.2]],
                   [[0.5, 0.5], [0.8, 0.2], [0.6, 0.4], [0.7, 0.3]]])
    m = routing_mismatch(a, b, wa, wb)
    assert m["routing/set_differs"] == [0.25, 0.25]
    assert m["routing/order_differs"] == [0.5, 0.25]
    assert m["routing/any_layer_set_differs"] == 0.5  # tokens 2 and 3
    assert m["routing/set_differs_mean"] == 0.25
    # layer 0, same-set tokens 0, 1, 3: |w - w_ref| by expert id: 0, (expert 2: 0.7 vs 0.75, 3: 0.3 vs 0.25), 0.1
    assert m["routing/weight_abs_max"][0] == pytest.approx(0.1)
    assert m["routing/weight_abs_mean"][0] == pytest.approx((0 + 0 + 0.05 + 0.05 + 0.1 + 0.1) / 6)
    assert m["routing/weight_abs_max"][1] == 0.0
    masked = routing_mismatch(a, b, mask=np.array([1, 1, 0, 0], dtype=bool))
    assert masked["routing/set_differs"] == [0.0, 0.0] and masked["routing/order_differs"] == [0.5, 0.0]


def test_routing_mismatch_errors():
    a = np.zeros((1, 2, 2), dtype=np.int64)
    with pytest.raises(MetricsInputError, match="same shape"):
        routing_mismatch(a, a[:, :1])
    with pytest.raises(MetricsInputError, match="both weights"):
        routing_mismatch(a, a, weights=a.astype(float))
    with pytest.raises(MetricsInputError, match="selects no token"):
        routing_mismatch(a, a, mask=np.zeros(2, dtype=bool))
