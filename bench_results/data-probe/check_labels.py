"""Check 1: with ASSISTANT_ONLY_LOSS, a row's label tokens are exactly each weighted answer's text (as the chat
template renders it: trimmed) and its end-of-turn marker; nothing from user/system turns or weight-0 answers.

python bench_results/data-probe/check_labels.py DATA.jsonl [N_ROWS] [--template plain]
Prints one line per failing row (line number in the file, expected vs got), then a count.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer  # noqa: E402

import chat_data  # noqa: E402
from collate import IGNORE_INDEX  # noqa: E402


def spans(labels: list[int]) -> list[tuple[int, int]]:
    out, first = [], None
    for j, lab in enumerate([*labels, IGNORE_INDEX]):
        if lab != IGNORE_INDEX and first is None:
            first = j
        elif lab == IGNORE_INDEX and first is not None:
            out, first = [*out, (first, j)], None
    return out


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 300
    tok = AutoTokenizer.from_pretrained(ROOT / "assets" / "tiny-gemma4")
    if "--template" in sys.argv and sys.argv[sys.argv.index("--template") + 1] == "plain":  # the E2B's cue
        block = "{% if not enable_thinking | default(false) %}{{ '<|channel>thought\n<channel|>' }}{% endif %}"
        tok.chat_template = tok.chat_template.replace(block, "")
    rows = chat_data.load_conversations(path, chat_data.control_tokens(tok))
    lines = [i for i, raw in enumerate(Path(path).read_bytes().splitlines(), 1) if raw.strip()]
    bad = 0
    for k, messages in enumerate(rows[:n]):
        ex = chat_data.tokenize_conversation(tok, messages, 1 << 30, assistant_only=True)
        ids, labels = ex["input_ids"], ex["labels"]
        assert all(lab in (IGNORE_INDEX, i) for i, lab in zip(ids, labels, strict=True))
        text, _ = chat_data.training_text(tok, messages)
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        got_text = [text[offsets[a][0] : offsets[b - 1][1]] for a, b in spans(labels)]
        got_decoded = [tok.decode(ids[a:b]) for a, b in spans(labels)]
        want = [
            chat_data.text_of(m).strip() + "<turn|>"
            for m in messages
            if m["role"] == "assistant" and m.get("weight", 1)
        ]
        if got_text != want or got_decoded != want:
            bad += 1
            pairs = enumerate(zip(got_text, want, strict=False))
            diff = next((i for i, (g, w) in pairs if g != w), min(len(got_text), len(want)))
            g = got_text[diff] if diff < len(got_text) else None
            w = want[diff] if diff < len(want) else None
            print(f"line {lines[k]}: {len(got_text)} spans, want {len(want)}; answer {diff}:")
            print(f"   want {w!r:.200}")
            print(f"   got  {g!r:.200}")
            if g and w:
                at = next((i for i, (x, y) in enumerate(zip(g, w, strict=False)) if x != y), min(len(g), len(w)))
                lo = max(0, at - 20)
                print(f"   first difference at char {at}: want {w[lo : at + 20]!r} got {g[lo : at + 20]!r}")
    print(f"{bad} of {min(n, len(rows))} rows with labels other than their weighted answers")


if __name__ == "__main__":
    main()
