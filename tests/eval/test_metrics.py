"""Zero-shot and retrieval metrics against hand-computed values; chunked == unchunked."""

import pytest
import torch

from infclip.eval.report import format_table, save_confusion_png, scalar_metrics, write_report
from infclip.eval.retrieval import ranks_to_metrics, retrieval_metrics, retrieval_ranks
from infclip.eval.zeroshot import ZeroShotCounts, true_class_rank

# 4 images, 6 classes. Worked by hand:
#   img0 label 0: class 0 is the max               -> pred 0, rank 0
#   img1 label 2: 5 classes score above class 2    -> pred 5, rank 5 (misses top-5)
#   img2 label 1: ties class 0 (lower index) at max -> pred 0, rank 1
#   img3 label 1: class 2 above                    -> pred 2, rank 1
LOGITS = torch.tensor([
    [0.9, 0.1, 0.2, 0.3, 0.4, 0.5],
    [0.5, 0.6, 0.1, 0.7, 0.8, 0.9],
    [0.3, 0.3, 0.0, 0.0, 0.0, 0.0],
    [0.0, 0.8, 0.9, 0.1, 0.1, 0.1],
])
LABELS = torch.tensor([0, 2, 1, 1])
NAMES = ["a", "b", "c", "d", "e", "f"]


def test_true_class_rank_tie_rule():
    assert true_class_rank(LOGITS, LABELS).tolist() == [0, 5, 1, 1]
    # a constant model: class y ranks at y (ties ordered by index)
    flat = torch.zeros(3, 4)
    assert true_class_rank(flat, torch.tensor([0, 2, 3])).tolist() == [0, 2, 3]


def test_zeroshot_counts_hand_computed():
    counts = ZeroShotCounts(6)
    counts.update(LOGITS[:2], LABELS[:2])  # two batches == one
    counts.update(LOGITS[2:], LABELS[2:])
    m = counts.metrics(NAMES)
    assert m["n"] == 4
    assert m["top1"] == pytest.approx(1 / 4)
    assert m["top5"] == pytest.approx(3 / 4)
    assert m["per_class"] == {"a": 1.0, "b": 0.0, "c": 0.0, "d": None, "e": None, "f": None}
    assert m["mean_per_class"] == pytest.approx(1 / 3)
    expected = torch.zeros(6, 6, dtype=torch.long)
    expected[0, 0] = expected[2, 5] = expected[1, 0] = expected[1, 2] = 1
    assert torch.equal(counts.confusion, expected)


def test_zeroshot_counts_merge_by_state_sum():
    a, b, whole = ZeroShotCounts(6), ZeroShotCounts(6), ZeroShotCounts(6)
    a.update(LOGITS[:1], LABELS[:1])
    b.update(LOGITS[1:], LABELS[1:])
    whole.update(LOGITS, LABELS)
    merged = ZeroShotCounts(6)
    merged.load_state(a.state + b.state)
    assert torch.equal(merged.state, whole.state)


def test_zeroshot_label_out_of_range_is_an_error():
    counts = ZeroShotCounts(6)
    with pytest.raises(ValueError, match="label 7 is outside the 6 class names"):
        counts.update(LOGITS[:1], torch.tensor([7]))


# Retrieval: text features = identity, so the i2t score matrix S is IMG itself.
S = torch.tensor([
    [1.0, 0.0, 0.0, 0.0],    # rank 0
    [0.5, 0.5, 0.0, 0.0],    # ties j=0 (lower index): rank 1
    [0.9, 0.8, 0.1, 0.95],   # three above: rank 3
    [0.0, 0.0, 0.0, 0.2],    # rank 0
])


def test_retrieval_hand_computed():
    img, txt = S.clone(), torch.eye(4)
    assert retrieval_ranks(img, txt).tolist() == [0, 1, 3, 0]
    # t2i: query text i scores image j by S[j, i] (columns of S)
    assert retrieval_ranks(txt, img).tolist() == [0, 1, 0, 1]
    m = retrieval_metrics(img, txt)
    assert m["i2t_r1"] == pytest.approx(0.5)
    assert m["i2t_r5"] == m["i2t_r10"] == pytest.approx(1.0)
    assert m["i2t_median_rank"] == pytest.approx(1.5)  # 1-based ranks 1,1,2,4
    assert m["t2i_r1"] == pytest.approx(0.5)
    assert m["t2i_median_rank"] == pytest.approx(1.5)  # 1,1,2,2
    assert m["n_pairs"] == 4


def test_median_rank_odd_and_constant_model():
    assert ranks_to_metrics(torch.tensor([4, 0, 2]), "x")["x_median_rank"] == 3.0
    n = 12
    ones = torch.ones(n, 3)  # every score ties: query i ranks at i
    assert retrieval_ranks(ones, ones).tolist() == list(range(n))
    assert retrieval_metrics(ones, ones)["i2t_r1"] == pytest.approx(1 / n)


@pytest.mark.parametrize("chunk", [1, 3, 7, 50])
def test_retrieval_chunked_equals_unchunked(chunk):
    g = torch.Generator().manual_seed(0)
    n = 37
    img = torch.nn.functional.normalize(torch.randn(n, 8, generator=g), dim=1)
    txt = torch.nn.functional.normalize(img + 0.8 * torch.randn(n, 8, generator=g), dim=1)
    txt[5] = txt[6]  # exact ties
    # reference from the full matrix with a stable sort (index order on ties)
    full = img @ txt.T
    order = torch.sort(-full, dim=1, stable=True).indices
    ref = (order == torch.arange(n).unsqueeze(1)).int().argmax(dim=1)
    assert torch.equal(retrieval_ranks(img, txt, chunk_size=chunk), ref)
    assert retrieval_metrics(img, txt, chunk_size=chunk) == retrieval_metrics(img, txt, chunk_size=n)


def test_retrieval_ranks_of_a_query_slice_match_the_full_ranks():
    """A rank owning rows offset..offset+Q-1 ranks its queries against all candidates."""
    g = torch.Generator().manual_seed(1)
    img = torch.randn(20, 6, generator=g)
    txt = img.clone()
    txt[3:9] = txt[3]  # ties across the slice boundary
    full = retrieval_ranks(img, txt, chunk_size=4)
    for offset, q in ((0, 5), (5, 7), (12, 8)):
        part = retrieval_ranks(img[offset:offset + q], txt, chunk_size=3, offset=offset)
        assert torch.equal(part, full[offset:offset + q])
    with pytest.raises(ValueError, match="fall outside"):
        retrieval_ranks(img[:5], txt, offset=18)


def test_report_outputs(tmp_path):
    counts = ZeroShotCounts(6)
    counts.update(LOGITS, LABELS)
    report = {"zeroshot": counts.metrics(NAMES), "retrieval": retrieval_metrics(S, torch.eye(4)), "step": 3}
    scalars = scalar_metrics(report)
    assert scalars["zeroshot/top1"] == pytest.approx(0.25)
    assert scalars["retrieval/i2t_r1"] == pytest.approx(0.5)
    assert "zeroshot/per_class" not in scalars and "zeroshot/n" not in scalars
    assert scalar_metrics(report, counts=True)["zeroshot/n"] == 4
    # CLIP_benchmark's names repeat the project's values: in the report and the table, once in TensorBoard
    assert "zeroshot/acc1" not in scalars and "retrieval/text_retrieval_recall@1" not in scalars
    both = scalar_metrics(report, aliases=True)
    assert both["zeroshot/acc1"] == scalars["zeroshot/top1"]
    assert both["retrieval/text_retrieval_recall@1"] == scalars["retrieval/i2t_r1"]
    table = format_table(report)
    assert "zeroshot/top5" in table and "0.7500" in table
    path = write_report(report, tmp_path / "r" / "report.json")
    import json
    assert json.loads(open(path).read())["zeroshot"]["per_class"]["d"] is None
    png = save_confusion_png(counts.confusion, NAMES, tmp_path / "c.png")
    from PIL import Image
    with Image.open(png) as im:
        assert im.format == "PNG" and im.width > 6 * 4
        colours = dict((c, n) for n, c in im.convert("RGB").getcolors(1 << 20))
    # row a is 1/1 on the diagonal: one fully shaded cell; row b is split 1/2, 1/2
    full, half = (30, 85, 255), (int(255 - 225 * 0.5), int(255 - 170 * 0.5), 255)
    assert colours.get(full, 0) > 0 and colours.get(half, 0) > 0
