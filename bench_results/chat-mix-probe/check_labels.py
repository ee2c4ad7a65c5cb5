"""Every label token of every row, decoded, is exactly the row's weighted answers (as the template renders them:
trimmed) each through its end-of-turn marker, and nothing else.

    python bench_results/chat-mix-probe/check_labels.py MIX.jsonl [MODEL]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import chat_data  # noqa: E402

path = sys.argv[1]
model = sys.argv[2] if len(sys.argv) > 2 else str(Path(__file__).resolve().parents[2] / "assets" / "tiny-gemma4")
tok = chat_data.chat_tokenizer(model)
rows = chat_data.load_conversations(path, chat_data.control_tokens(tok))
bad, spans_total = [], 0
for i, messages in enumerate(rows):
    enc = chat_data.tokenize_conversation(tok, messages, 1 << 30, assistant_only=True)
    spans, current = [], []
    for token, label in zip(enc["input_ids"], enc["labels"], strict=True):
        if label != chat_data.IGNORE_INDEX:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    got = [tok.decode(s) for s in spans]
    want = [
        chat_data.text_of(m).strip() + chat_data.END_OF_TURN
        for m in messages
        if m["role"] == "assistant" and m.get("weight", 1)
    ]
    spans_total += len(want)
    if got != want:
        bad.append((i, next((g, w) for g, w in zip(got + [None] * 9, want + [None] * 9, strict=False) if g != w)))
print(f"{len(rows)} rows, {spans_total} weighted answers: {len(bad)} rows whose labels differ")
for i, (g, w) in bad[:5]:
    print(f"  row {i}: labels {g!r:.120}\n         answer {w!r:.120}")
