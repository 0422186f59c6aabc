"""The two sides tokenise independently (synthetic checkpoints carry no tokenizer): the same
prompt must give the same ids, token types and Engram compressed map on both."""
import pytest
import torch

from engine.deepseek_v41_flash.config import Config
from engine.deepseek_v41_flash.language import tokens as E
from oracle.deepseek_v41_flash import tokens as O
from oracle.deepseek_v41_flash.config import ModelArgs
from tensordiff.errors import BadInput
from tensordiff.synthetic.deepseek_v41_flash_language import language_config

CFG = language_config(64)


@pytest.mark.parametrize("prompt,cells", [
    ("A picture: <image> What does it show?", (2, 3)),
    ("Tabs\tand\nnewlines, ÜNICODE ✓ <image>", (3, 1)),
    ("text only", None),
])
def test_both_sides_tokenise_alike(prompt, cells):
    ids_o, types_o, start = O.build_prompt(prompt, ModelArgs(**CFG), cells)
    ids_e, types_e = E.tokenize(prompt, Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in CFG.items()}),
                                cells)
    assert torch.equal(ids_o, ids_e) and torch.equal(types_o, types_e)
    if cells is not None:
        assert int(types_o[start]) == 0 and int((types_o >= 0).sum()) == cells[0] * (cells[1] + 1) + 2


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
