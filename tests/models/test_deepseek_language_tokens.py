"""The two sides tokenise independently (synthetic checkpoints carry no tokenizer): the same
prompt must give the same ids, token types and Engram compressed map on both."""
import pytest
import torch

from engine.deepseek_v41_flash.config import Config
from engine.deepseek_v41_flash import tokens as E
from oracle.deepseek_v41_flash import tokens as O
from oracle.deepseek_v41_flash.config import ModelArgs
from tensordiff.errors import BadInput
from tensordiff.models.deepseek_v41_flash.synthetic_language import language_config

CFG = language_config(64)


@pytest.mark.parametrize("prompt,cells", [
    ("A picture: <image> What does it show?", (2, 3)),
    ("Tabs\tand\nnewlines, ÜNICODE ✓ <image>", (3, 1)),
    ("text only", None),
])
def test_both_sides_tokenise_alike(prompt, cells):
    ids_o, types_o, starts = O.build_prompt(prompt, ModelArgs(**CFG), cells)
    ids_e, types_e = E.tokenize(prompt, Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in CFG.items()}),
                                cells)
    assert torch.equal(ids_o, ids_e) and torch.equal(types_o, types_e)
    if cells is not None:
        assert len(starts) == 1 and int(types_o[starts[0]]) == 0
        assert int((types_o >= 0).sum()) == cells[0] * (cells[1] + 1) + 2


def test_compressed_maps_agree():
    a, na = O.compressed_token_map(CFG["vocab_size"])
    b, nb = E.compressed_token_map(CFG["vocab_size"])
    assert na == nb == CFG["engram_compressed_vocab_size"] and torch.equal(a, b)


def test_both_sides_refuse_a_second_image():
    with pytest.raises(BadInput):
        O.build_prompt("<image><image>", ModelArgs(**CFG), (1, 1))
    with pytest.raises(BadInput):  # EngineInputError is a BadInput: exit 2 at the CLI
        E.tokenize("<image><image>", Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in CFG.items()}),
                   (1, 1))


def test_both_sides_refuse_an_image_without_its_placeholder():
    """The official prepare_vl_inputs raises when placeholders and images do not pair up."""
    with pytest.raises(BadInput, match="<image>"):
        O.build_prompt("no placeholder here", ModelArgs(**CFG), (1, 4))
    with pytest.raises(BadInput, match="<image>"):
        E.tokenize("no placeholder here", Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in CFG.items()}),
                   (1, 4))


ECFG = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in CFG.items()})


@pytest.mark.parametrize("prompt,cells", [
    ("First <image> then <image>.", [(2, 3), (1, 1)]),
    ("<image><image><image>", [(1, 4), (3, 1), (2, 2)]),
])
def test_both_sides_tokenise_several_images_alike(prompt, cells):
    """prepare_vl_inputs: tag k becomes image k's own span, sized by its own grid, the text
    between them kept as it is (no separator)."""
    ids_o, types_o, starts = O.build_prompt(prompt, ModelArgs(**CFG), cells)
    ids_e, types_e = E.tokenize(prompt, ECFG, cells)
    assert torch.equal(ids_o, ids_e) and torch.equal(types_o, types_e)
    assert starts == (types_o == 0).nonzero().flatten().tolist()
    text = prompt.split("<image>")
    pos = 1 + len(text[0].encode())
    for k, (h, w) in enumerate(cells):  # each span where its tag was, after the earlier spans
        n = h * (w + 1) + 2
        assert starts[k] == pos and torch.equal(types_o[pos:pos + n], O.image_token_types(h, w))
        pos += n + len(text[k + 1].encode())
    assert pos == ids_o.numel()


@pytest.mark.parametrize("prompt,cells", [("<image> and <image>", [(1, 1)]), ("<image>", [(1, 1), (2, 2)]),
                                          ("<image> <image>", [(1, 1), (1, 1), (1, 1)])])
def test_both_sides_refuse_tags_that_do_not_pair_with_images(prompt, cells):
    with pytest.raises(BadInput, match="<image>"):
        O.build_prompt(prompt, ModelArgs(**CFG), cells)
    with pytest.raises(BadInput, match="<image>"):
        E.tokenize(prompt, ECFG, cells)
