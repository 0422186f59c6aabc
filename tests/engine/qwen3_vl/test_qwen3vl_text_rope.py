"""The text M-RoPE layout (interleaved vs chunked) and the sequence's row helpers, engine only."""
import torch

from engine.qwen3_vl.sequence import add_every_row, add_rows, pad_ranges
from engine.qwen3_vl.text_rope import axis_of_frequency, mrope_tables
from engine.runtime.embedding import Span


def test_interleaved_layout_of_the_released_sections():
    axis = axis_of_frequency((24, 20, 20)).tolist()
    assert len(axis) == 64
    assert [axis[j] for j in range(6)] == [0, 1, 2, 0, 1, 2]  # t, h, w, t, h, w, ...
    assert axis[58:] == [1, 2, 0, 0, 0, 0]  # h and w end at 3·20; the tail is t
    assert axis.count(0) == 24 and axis.count(1) == 20 and axis.count(2) == 20


def test_chunked_layout_is_a_different_assignment_with_the_same_counts():
    inter, chunked = axis_of_frequency((6, 3, 3)), axis_of_frequency((6, 3, 3), interleaved=False)
    assert chunked.tolist() == [0] * 6 + [1] * 3 + [2] * 3
    assert sorted(inter.tolist()) == sorted(chunked.tolist()) and inter.tolist() != chunked.tolist()


def test_text_rows_are_layout_blind_image_rows_are_not():
    text = torch.arange(5).expand(3, -1)
    a = mrope_tables(text, 24, 5e6, (6, 3, 3))
    b = mrope_tables(text, 24, 5e6, (6, 3, 3), interleaved=False)
    assert torch.equal(a[0], b[0])  # t = h = w: nothing tells the layouts apart
    image = torch.tensor([[3, 3, 3], [3, 4, 5], [3, 7, 2]])  # three image rows, distinct h / w
    assert not torch.equal(mrope_tables(image, 24, 5e6, (6, 3, 3))[0],
                           mrope_tables(image, 24, 5e6, (6, 3, 3), interleaved=False)[0])


def test_pad_ranges_and_deepstack_rows():
    ids = torch.tensor([1, 9, 9, 9, 2, 3, 9, 9, 4])
    assert pad_ranges(ids, 9) == [(1, 3), (6, 2)]
    spans = [Span(1, torch.ones(3, 2)), Span(6, 2 * torch.ones(2, 2))]
    x = add_rows(torch.zeros(9, 2), 0, spans)
    assert x[:, 0].tolist() == [0, 1, 1, 1, 0, 0, 2, 2, 0]
    # one chunk [5, 9): only the rows inside it, at their chunk-relative place
    assert add_rows(torch.zeros(4, 2), 5, spans)[:, 0].tolist() == [0, 2, 2, 0]
    # the planted fault: every row gets a feature (text rows the last visual row's before them)
    assert add_every_row(torch.zeros(9, 2), 0, spans)[:, 0].tolist() == [1, 1, 1, 1, 1, 1, 2, 2, 2]
