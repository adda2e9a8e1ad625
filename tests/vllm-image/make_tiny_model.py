"""Make a tiny chat model that vLLM can serve, with no download: random weights, a locally trained tokenizer.

A Llama config with 2 layers and hidden size 128, random weights (seeded, so every
build is the same), a word-level tokenizer trained with the `tokenizers` library on
text written here (a byte-level BPE would make the random model emit broken
characters), and a ChatML chat template. Usage: python make_tiny_model.py OUTPUT_DIR
"""

from __future__ import annotations

import sys

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
WORDS = (
    "the quick brown fox jumps over a lazy dog while gpus share tensors over links and "
    "nginx streams tokens to agents who ask for answers about models memory bandwidth latency "
    "user assistant system hello world yes no one two three four five six seven eight nine ten"
).split()


def main(out: str) -> None:
    torch.manual_seed(0)
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))] * 4
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=SPECIAL))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="</s>",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHATML
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    print(f"tiny model in {out}: vocab {len(fast)}, {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main(sys.argv[1])
