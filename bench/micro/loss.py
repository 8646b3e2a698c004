"""Loss throughput: dapo.loss.policy_loss against verl 0.9.1's compute_policy_loss_vanilla + agg_loss.

Same inputs, forward and backward, interleaved in one run; the ratio is what counts (absolute times on a
shared machine are noise). Run: python -m bench.micro.loss [--json PATH]
"""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from bench.common import parser, print_table, time_interleaved, write_json
from dapo.loss import policy_loss


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--responses", type=int, default=256)
    p.add_argument("--length", type=int, default=1024)
    args = p.parse_args()

    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    gen = torch.Generator().manual_seed(0)
    n, t = args.responses, args.length
    log_prob = (torch.randn(n, t, generator=gen) * 0.5).requires_grad_(True)
    old = log_prob.detach() + torch.randn(n, t, generator=gen) * 0.3
    adv = torch.randn(n, t, generator=gen)
    lengths = torch.randint(1, t + 1, (n,), generator=gen)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    config = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.28,
            "clip_ratio_c": 10.0,
            "global_batch_info": {},
        }
    )

    def ours():
        loss, _ = policy_loss(log_prob, old, adv, mask, clip_ratio_c=10.0)
        loss.backward()
        log_prob.grad = None
        return loss

    def verl():
        loss, _ = compute_policy_loss_vanilla(old, log_prob, adv, mask, "token-mean", config)
        loss.backward()
        log_prob.grad = None
        return loss

    torch.testing.assert_close(ours(), verl(), rtol=1e-5, atol=1e-6)  # same inputs, same loss
    times = time_interleaved({"ours": ours, "verl": verl}, args.repeats)
    ratio = times["verl"] / times["ours"]
    tokens = float(mask.sum())
    print(f"policy loss forward+backward, {n} responses x {t} tokens ({int(tokens)} valid), median of {args.repeats}")
    print_table(
        ["contender", "ms / call", "M tokens / s"],
        [[name, s * 1e3, tokens / s / 1e6] for name, s in times.items()],
    )
    print(f"speed ratio ours / verl: {ratio:.2f}x (>1 means ours is faster)")
    write_json(
        args.json,
        {
            "ours": {"step_s": times["ours"]},
            "verl": {"step_s": times["verl"]},
            "ratio_ours_over_verl": ratio,
            "responses": n,
            "length": t,
        },
    )


if __name__ == "__main__":
    main()
