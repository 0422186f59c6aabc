"""Oracle generation: decode by full recomputation, stopped by a generated image token."""
import torch

from oracle.deepseek_v41_flash.config import ModelArgs
from oracle.deepseek_v41_flash.model import ImageSpan, build, generate
from oracle.deepseek_v41_flash.tokens import build_prompt
from tensordiff.format.capture import MemoryRecorder
from tensordiff.models.deepseek_v41_flash.synthetic_language import tiny_language_checkpoint


def test_image_token_stops_generation_and_steps_extend_the_prompt():
    ck = tiny_language_checkpoint()
    args = ModelArgs.from_dir(ck)
    model = build(args, ck, torch.float32)
    ids, types, (start,) = build_prompt("Look <image> then tell.", args, (1, 2))  # one span start per image
    rows = torch.randn(2, args.dim, generator=torch.Generator().manual_seed(2))
    images = [ImageSpan(start, types[start:start + 6], rows)]
    rec = MemoryRecorder()
    # index_keys=own: decode rows read the prefill rule's keys, so a step is a plain longer prefill
    out = generate(model, ids, types, images, 2, rec, index_keys="own")
    assert out["stop"] == "steps" and len(out["generated"]) == 3
    # step 1's logits are the last row of the prompt + first token, run from scratch
    longer = torch.cat([ids, torch.tensor(out["generated"][:1])])
    full = model(longer[None], torch.cat([types, torch.tensor([-1])])[None], images)
    torch.testing.assert_close(rec.tensors["logits.step.1"], full[0, -1:])

    with torch.no_grad():
        model.head.weight[args.image_token_id] = 2 * model.head.weight[out["generated"][0]]
    rec = MemoryRecorder()
    out = generate(model, ids, types, images, 2, rec)
    assert out == {"generated": [args.image_token_id], "stop": "image-token"}
    assert not [n for n in rec.tensors if n.startswith("logits.step")]
