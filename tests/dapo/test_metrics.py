"""dapo.metrics.repeat_ngram_frac on hand-written token lists."""

import pytest
import torch

from dapo.metrics import repeat_ngram_frac


def _batch(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``[N, T]`` ids and mask from token lists (the pad id is a real id, to show the mask decides)."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def test_repeated_four_grams_by_hand():
    ids, mask = _batch(
        [
            [5, 6, 7, 8, 9, 5, 6, 7, 8],  # 5 6 7 8 at 0 and 5: repeats
            [5, 6, 7, 8, 9, 5, 6, 7, 1],  # 5 6 7 occurs twice, but no 4-gram does
            [3, 3, 3, 3, 3],  # 3 3 3 3 at 0 and 1 (overlapping): repeats
            [3, 3, 3, 3],  # one 4-gram only
            [1, 2, 1, 2, 1, 2],  # 1 2 1 2 at 0 and 2: repeats
            [4, 9],  # shorter than n
        ]
    )
    # 3 of 6 rows repeat
    assert repeat_ngram_frac(ids, mask, n=4) == pytest.approx(3 / 6)
    # with n = 3 the second row repeats too (5 6 7), and [3, 3, 3, 3] (3 3 3 at 0 and 1): 5 of 6
    assert repeat_ngram_frac(ids, mask, n=3) == pytest.approx(5 / 6)
    # n = 1: any token twice; only [4, 9] has none
    assert repeat_ngram_frac(ids, mask, n=1) == pytest.approx(5 / 6)


def test_padding_never_counts_as_a_repeat():
    # [7, 0, 0, 0, 0, 0, 0, 0, 0] would repeat 0 0 0 0 if the padding were read; the mask says one token
    ids, mask = _batch([[7], [1, 2, 3, 4, 5, 6, 7, 8, 9]], pad=0)
    assert repeat_ngram_frac(ids, mask) == 0.0
    # the same pad id inside a response does count: 0 0 0 0 0 is five real tokens
    ids, mask = _batch([[0, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7, 8, 9]], pad=0)
    assert repeat_ngram_frac(ids, mask) == 0.5


def test_agrees_with_a_set_of_tuples_on_random_responses():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (64, 20), generator=g)  # a small vocabulary, so some rows repeat and some do not
    lengths = torch.randint(1, 21, (64,), generator=g)
    mask = (torch.arange(20) < lengths[:, None]).long()
    expected = []
    for row, length in zip(ids.tolist(), lengths.tolist()):
        grams = [tuple(row[i : i + 4]) for i in range(length - 3)]
        expected.append(len(grams) != len(set(grams)))
    assert 0 < sum(expected) < 64
    assert repeat_ngram_frac(ids, mask) == pytest.approx(sum(expected) / 64)


def test_bad_n_names_the_argument():
    ids, mask = _batch([[1, 2]])
    with pytest.raises(ValueError, match="n must be >= 1"):
        repeat_ngram_frac(ids, mask, n=0)
