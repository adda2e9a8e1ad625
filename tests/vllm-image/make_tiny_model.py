"""Make a tiny chat model that vLLM can serve, with no download: trained here in seconds, with its own tokenizer.

A Llama config with 2 layers and hidden size 128, a word-level tokenizer trained with
the `tokenizers` library on text written here (a byte-level BPE would make the model
emit broken characters), and a ChatML chat template. The weights are trained for a few
hundred steps (seeded) to continue that text, the word list below in a cycle: given a
run of it, greedy decoding goes on with the next words, so a correct server's output is
known and varied, and a broken one (zeroed weights, a wrong all-reduce) stands out.
A second folder holds the same model with every weight zeroed: a server that answers
degenerate text, for the correctness gate's tests.
Usage: python make_tiny_model.py OUTPUT_DIR [ZEROED_DIR]
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


def train(model: LlamaForCausalLM, ids: list[int], steps: int = 300, length: int = 48) -> float:
    """Next-token training on windows of the cycle ``ids``; returns the last loss."""
    cycle = torch.tensor(ids * (length // len(ids) + 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loss = torch.tensor(0.0)
    for _step in range(steps):
        starts = torch.randint(0, len(ids), (16,))
        batch = torch.stack([cycle[start : start + length] for start in starts])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss)


def main(out: str, zeroed: str | None = None) -> None:
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
    model = LlamaForCausalLM(config)
    loss = train(model, fast(" ".join(WORDS), add_special_tokens=False)["input_ids"])
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    print(f"tiny model in {out}: vocab {len(fast)}, {sum(p.numel() for p in model.parameters())} parameters, loss {loss:.3f}")
    if zeroed:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.zero_()
        model.save_pretrained(zeroed)
        fast.save_pretrained(zeroed)
        print(f"the same model with zeroed weights in {zeroed}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
