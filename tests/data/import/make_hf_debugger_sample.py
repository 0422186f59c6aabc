"""Writes hf-debugger/: transformers 5.17.0's model-addition debugger on a tiny random Llama
(one layer), tensors saved (use_repr=False). Run from this directory:
    python make_hf_debugger_sample.py
"""
import shutil

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.model_debugging_utils import model_addition_debugger_context

cfg = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, max_position_embeddings=16)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).eval()
shutil.rmtree("hf-debugger", ignore_errors=True)
with model_addition_debugger_context(model, debug_path="hf-debugger", do_prune_layers=False, use_repr=False):
    with torch.no_grad():
        model(torch.tensor([[1, 5, 7]]))
