"""Generate the embedded default: a tiny random-weight Gemma 4 and a sample chat dataset.

Deterministic and offline. Writes
  assets/tiny-gemma4/     config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
                          chat_template.jinja  (loadable with from_pretrained like the real model)
  assets/sample_chat.jsonl   chat rows: single-turn, multi-turn and system-turn, varied length

The model is the real `gemma4_unified` architecture (Gemma4UnifiedForConditionalGeneration) with
vision and audio embedders, 6 text layers (layer 5 is global attention with attention_k_eq_v:
no v_proj), final logit softcapping and tied embeddings, at a hidden size of 64.

    python tools/make_tiny_gemma4.py [--out assets]
"""

import argparse
import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from transformers.models.gemma4_unified import Gemma4UnifiedConfig

# Gemma 4's chat format: <bos> once, then <|turn>ROLE\n...<turn|>\n per message; the assistant's
# role is written "model". add_generation_prompt opens a model turn and, with thinking off (the default), closes
# an empty thought block in it, as the 12B/26B/31B checkpoints' templates do: a turn rendered as history has no
# such block, so the prompt a server sends is not a prefix of the conversation it renders.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<|turn>' + role + '\n' + message['content'] | trim + '<turn|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|turn>model\n' }}"
    "{% if not enable_thinking | default(false) %}{{ '<|channel>thought\n<channel|>' }}{% endif %}"
    "{% endif %}"
)
SPECIAL_TOKENS = [
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<|turn>",
    "<turn|>",
    "<|image|>",
    "<|audio|>",
    "<|video|>",
    "<boi>",
    "<eoi>",
    "<boa>",
    "<eoa>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
]
VOCAB_SIZE = 1024

TOPICS = [
    "the weather",
    "distributed training",
    "a sourdough recipe",
    "prime numbers",
    "the Moon",
    "gradient descent",
    "a train timetable",
    "tea",
    "the Rhine",
    "sorting algorithms",
    "a bicycle repair",
    "jazz",
    "photosynthesis",
    "a chess opening",
    "the ocean",
    "compilers",
]
WORDS = (
    "the a model gradient token rank batch learning rate loss step layer memory network data "
    "answer question simple careful good small large first second because therefore when "
    "every each process device update weights adapter sequence length value result"
).split()


def sentence(rng: random.Random, n_min: int, n_max: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(n_min, n_max))]
    return " ".join(words).capitalize() + "."


def sample_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        messages = []
        if i % 3 == 0:
            messages.append(
                {"role": "system", "content": f"You are a concise assistant who knows {rng.choice(TOPICS)}."}
            )
        for _ in range(1 + (i % 4 == 1) + 2 * (i % 5 == 2)):  # 1, 2 or 3 exchanges
            messages.append({"role": "user", "content": f"Tell me about {rng.choice(TOPICS)}. " + sentence(rng, 3, 12)})
            messages.append(
                {"role": "assistant", "content": " ".join(sentence(rng, 4, 16) for _ in range(rng.randint(1, 6)))}
            )
        rows.append({"messages": messages})
    return rows


def build_tokenizer(texts: list[str], out: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        chat_template=CHAT_TEMPLATE,
        extra_special_tokens={"start_of_turn_token": "<|turn>", "end_of_turn_token": "<turn|>"},
    )
    fast.save_pretrained(out)
    return fast


def build_model(tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    ids = tokenizer.convert_tokens_to_ids
    cfg = Gemma4UnifiedConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            final_logit_softcapping=30.0,
            sliding_window=128,
            max_position_embeddings=4096,
            pad_token_id=ids("<pad>"),
            eos_token_id=ids("<eos>"),
            bos_token_id=ids("<bos>"),
        ),
        vision_config=dict(
            patch_size=4, pooling_kernel_size=2, mm_embed_dim=32, mm_posemb_size=16, output_proj_dims=32
        ),
        audio_config=dict(audio_embed_dim=32),
        image_token_id=ids("<|image|>"),
        audio_token_id=ids("<|audio|>"),
        video_token_id=ids("<|video|>"),
        boi_token_id=ids("<boi>"),
        eoi_token_id=ids("<eoi>"),
        boa_token_id=ids("<boa>"),
        eoa_token_index=ids("<eoa>"),
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = [ids("<eos>"), ids("<turn|>")]
    model.save_pretrained(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "assets"))
    args = ap.parse_args()
    out = Path(args.out)
    rows = sample_rows(96)
    with open(out / "sample_chat.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    texts = [m["content"] for r in sample_rows(400, seed=1) for m in r["messages"]]
    tokenizer = build_tokenizer(texts, out / "tiny-gemma4")
    build_model(tokenizer, out / "tiny-gemma4")
    print(f"wrote {out / 'tiny-gemma4'} and {out / 'sample_chat.jsonl'} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
