"""`bench.common.op_profile`: where a call spends its time, the matrix products apart (`bench.micro.step --profile`)."""

from __future__ import annotations

import torch

from bench.common import PRODUCT_OPS, op_profile


def test_the_products_are_counted_apart_from_the_other_ops():
    x, w = torch.randn(64, 128), torch.randn(128, 128)

    def work():
        for _ in range(5):
            torch.mm(x, w)  # 5 products
        torch.bmm(x.view(4, 16, 128), w.expand(4, 128, 128))  # 1 batched product
        (x * 2.0).exp()  # and two ops that are not products

    prof = op_profile(work, top=50)
    calls = {o["op"]: o["calls"] for o in prof["top"]}
    assert calls["aten::mm"] == 5 and calls["aten::bmm"] == 1 and calls["aten::mul"] == 1 and calls["aten::exp"] == 1
    products = sum(o["self_s"] for o in prof["top"] if o["op"] in PRODUCT_OPS)
    assert abs(prof["products_s"] - products) < 1e-9  # every op is listed here (top=50), so the sums agree
    assert 0.0 < prof["products_s"] < prof["ops_s"]
    assert prof["top"] == sorted(prof["top"], key=lambda o: -o["self_s"])


def test_top_keeps_the_longest_ops_only():
    x = torch.randn(256, 256)
    prof = op_profile(lambda: [torch.mm(x, x), x.sin(), x.cos(), x.tanh()], top=2)
    assert len(prof["top"]) == 2
