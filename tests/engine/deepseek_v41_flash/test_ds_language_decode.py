"""Engine decode: the vision rows are asked for once (at prefill, never per generated token),
the KV-cached decode equals re-running the whole sequence, and a generated image token ends
generation without being fed back."""
import pytest
import torch

import engine.backend as backends
from engine.deepseek_v41_flash.model import LanguageModel
from engine.deepseek_v41_flash.tokens import tokenize
from tensordiff.format.capture import MemoryRecorder
from tensordiff.models.deepseek_v41_flash.synthetic_language import tiny_language_checkpoint

CELLS = (2, 3)
PROMPT = "Look <image> then tell."


@pytest.fixture(scope="module")
def lm():
    return LanguageModel.load(tiny_language_checkpoint(), dtype=torch.float32, backend=backends.get("torch"))


@pytest.fixture(scope="module")
def rows():
    return torch.randn(CELLS[0] * CELLS[1], 64, generator=torch.Generator().manual_seed(11))


def test_vision_runs_once_across_chunks_and_decode(lm, rows):
    calls = []

    def vision():
        calls.append(1)
        return rows

    ids, types = tokenize(PROMPT, lm.cfg, CELLS)
    seq = lm.sequence(ids, types, image=vision, cells=CELLS)
    last = seq.prefill(chunk=8)  # the span is [6, 16): cut at 8
    seq.decode(4, last)
    assert len(calls) == 1 and seq.vision_calls == 1


def test_cached_decode_equals_recomputing_the_sequence(rows):
    # index_keys=own: under the official rule a decode step reads other keys than a prefill of
    # the same tokens would (tests/models/test_deepseek_language_indexer.py checks that rule)
    lm = LanguageModel.load(tiny_language_checkpoint(), dtype=torch.float32, backend=backends.get("torch"),
                            index_keys="own")
    ids, types = tokenize(PROMPT, lm.cfg, CELLS)
    seq = lm.sequence(ids, types, image=lambda: rows, cells=CELLS)
    rec = MemoryRecorder()
    gen = seq.decode(3, seq.prefill(chunk=8), rec)
    # the same tokens as a prompt, prefilled in one go: its last rows are the decode steps' logits
    full_ids = torch.cat([ids, torch.tensor(gen[:3])])
    full_types = torch.cat([types, torch.full((3,), -1)])
    again = lm.sequence(full_ids, full_types, image=lambda: rows, cells=CELLS)
    rec2 = MemoryRecorder()
    again.prefill(None, rec2)
    for k in (1, 2, 3):
        torch.testing.assert_close(rec.tensors[f"logits.step.{k}"][0], rec2.tensors["logits"][ids.numel() + k - 1],
                                   atol=1e-4, rtol=1e-4)


def test_generated_image_token_stops_generation(rows):
    lm = LanguageModel.load(tiny_language_checkpoint(), dtype=torch.float32, backend=backends.get("torch"))
    ids, types = tokenize(PROMPT, lm.cfg, CELLS)
    last = lm.sequence(ids, types, image=lambda: rows, cells=CELLS).prefill()
    winner = int(last.argmax())
    lm.head[lm.cfg.image_token_id] = 2 * lm.head[winner]  # the image token now wins
    seq = lm.sequence(ids, types, image=lambda: rows, cells=CELLS)
    rec = MemoryRecorder()
    gen = seq.decode(3, seq.prefill(None, rec), rec)
    assert gen == [lm.cfg.image_token_id] and seq.stop == "image-token"
    assert not [n for n in rec.tensors if n.startswith("logits.step")]
    assert seq.pos == ids.numel()  # never fed back


@pytest.mark.parametrize("chunk", [3, 11])
def test_any_chunking_gives_the_single_shot_tensors(lm, rows, chunk):
    """Odd chunk lengths leave compressor groups and n-gram windows open across chunk ends."""
    ids, types = tokenize(PROMPT, lm.cfg, CELLS)
    recs = []
    for c in (None, chunk):
        rec = MemoryRecorder()
        lm.sequence(ids, types, image=lambda: rows, cells=CELLS).prefill(c, rec)
        recs.append(rec.tensors)
    assert recs[0].keys() == recs[1].keys()
    for name, t in recs[0].items():
        if t.dtype == torch.int64:
            assert torch.equal(t, recs[1][name]), name
        else:
            torch.testing.assert_close(recs[1][name], t, atol=1e-4, rtol=1e-4, msg=name)
