"""DeepSeek V4.1 Flash in the engine: preprocessing plan, vision tower, aligner, image span.

`run.run(req, rec)` is the runner the tensordiff adapter calls; `VisionEngine` is the reusable
piece (weights prepared once, then `encode(pixels/patches)` per image).
"""
