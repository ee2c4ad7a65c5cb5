"""A realistic chat mix in the project's JSONL format, seeded, no network.

python bench_results/data-probe/make_mix.py OUT.jsonl [--rows N] [--seed S]

What real exports carry: system prompts on some rows, 1 to 12 turns, log-normal message lengths (a few tokens to
well past MAX_LEN=2048), code blocks, markdown, CJK / Arabic / emoji / combining marks, content as text-part lists,
assistant turns of weight 0, exact duplicate rows, trailing whitespace (in content and after the JSON), CRLF
line endings on some lines, some rows ASCII-escaped (json ensure_ascii), a UTF-8 BOM at the start of the file.
The row kinds each row got are kept beside it in OUT.jsonl.meta (one JSON list per line), for the checks.
"""

import argparse
import codecs
import json
import random

WORDS = (
    "the model gradient batch token answer question learning rate memory layer network data value update "
    "sequence length device rank careful good small large first every each therefore because however which "
    "function return value error file line field parse loop index string list dict class object method"
).split()
CJK = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)] + [chr(c) for c in range(0x3041, 0x3097)]  # + hiragana
ARABIC = [chr(c) for c in range(0x0621, 0x064B)]
EMOJI = ["😀", "🚀", "👍🏽", "👩‍💻", "🇯🇵", "❤️", "🤔", "✅", "🔥", "👨‍👩‍👧‍👦"]
COMBINING = ["e\u0301", "a\u0300", "n\u0303", "o\u0308\u0304", "Vie\u0323\u0302t", "क्ष", "ñ", "Å", "ș"]
SYSTEMS = [
    "You are a helpful assistant.",
    "You are a senior Python reviewer. Answer with code when useful.",
    "Réponds en français, brièvement.",
    "あなたは丁寧なアシスタントです。",
    "أنت مساعد مفيد.",
]


def words(rng: random.Random, n: int) -> str:
    out = []
    for i in range(n):
        w = rng.choice(WORDS)
        out.append(w.capitalize() if i % 12 == 0 else w)
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out) + "."


def script_text(rng: random.Random, n: int) -> str:
    kind = rng.choice(["cjk", "arabic", "emoji", "combining"])
    if kind == "cjk":
        return "".join(rng.choice(CJK) for _ in range(n)) + "。"
    if kind == "arabic":
        return " ".join("".join(rng.choice(ARABIC) for _ in range(rng.randint(2, 7))) for _ in range(n // 4 + 1))
    if kind == "emoji":
        return " ".join(rng.choice(WORDS) + rng.choice(EMOJI) for _ in range(n // 3 + 1))
    return " ".join(rng.choice(COMBINING) + rng.choice(WORDS) for _ in range(n // 3 + 1))


def code_block(rng: random.Random, n: int) -> str:
    lines = [f"def {rng.choice(WORDS)}_{i}(x):\n    return x * {i}  # {rng.choice(WORDS)}" for i in range(n // 8 + 1)]
    lang = rng.choice(["python", "", "js", "bash"])
    return f"```{lang}\n" + "\n".join(lines) + "\n```"


def markdown(rng: random.Random, n: int) -> str:
    items = "\n".join(f"- **{rng.choice(WORDS)}**: {words(rng, 6)}" for _ in range(n // 8 + 1))
    table = "| a | b |\n|---|---|\n" + "\n".join(f"| {rng.choice(WORDS)} | {i} |" for i in range(3))
    return f"## {rng.choice(WORDS).title()}\n\n{items}\n\n{table}"


def content(rng: random.Random, n_words: int, kinds: set) -> str:
    """One message's text of about n_words words, from a few kinds of text."""
    parts, left = [], n_words
    while left > 0:
        n = min(left, max(3, int(rng.lognormvariate(3.5, 1.0))))
        r = rng.random()
        if r < 0.55:
            parts.append(words(rng, n))
        elif r < 0.7:
            parts.append(code_block(rng, n))
            kinds.add("code")
        elif r < 0.82:
            parts.append(markdown(rng, n))
            kinds.add("markdown")
        else:
            parts.append(script_text(rng, n))
            kinds.add("script")
        left -= n
    text = rng.choice(["\n\n", "\n", " "]).join(parts)
    if rng.random() < 0.1:  # whitespace the chat template trims
        text = rng.choice(["  ", "\n", " \r\n", "\t"]) + text + rng.choice([" ", "\n\n", "   \n", "\r\n"])
        kinds.add("padded-content")
    return text


def as_parts(rng: random.Random, text: str) -> list[dict]:
    cut = sorted(rng.sample(range(1, len(text)), min(2, len(text) - 1))) if len(text) > 2 else []
    pieces = [text[a:b] for a, b in zip([0, *cut], [*cut, len(text)], strict=True)]
    return [{"type": "text", "text": p} for p in pieces]


def row(rng: random.Random, scale: float) -> tuple[dict, list]:
    kinds: set = set()
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEMS)})
        kinds.add("system")
    turns = min(12, 1 + int(rng.expovariate(0.45)))
    for t in range(turns):
        user = content(rng, max(1, int(rng.lognormvariate(3.0, 1.1) * scale)), kinds)
        answer = content(rng, max(1, int(rng.lognormvariate(4.0, 1.2) * scale)), kinds)
        messages.append({"role": "user", "content": user})
        m = {"role": "assistant", "content": answer}
        if t < turns - 1 and rng.random() < 0.15:  # an earlier answer shown, not trained on
            m["weight"] = 0
            kinds.add("weight0")
        elif rng.random() < 0.1:
            m["weight"] = 1
        messages.append(m)
    for m in messages:
        if m["role"] != "system" and rng.random() < 0.08:
            m["content"] = as_parts(rng, m["content"])
            kinds.add("parts")
    kinds.add(f"turns{turns}")
    return {"messages": messages}, sorted(kinds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every message's length")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    lines, meta = [], []
    for _ in range(args.rows):
        if lines and rng.random() < 0.03:  # an exact duplicate of an earlier row (its bytes, line ending aside)
            j = rng.randrange(len(lines))
            lines.append(lines[j].rstrip(b"\r\n \t"))
            meta.append(meta[j] + ["duplicate"])
        else:
            r, kinds = row(rng, args.scale)
            lines.append(json.dumps(r, ensure_ascii=rng.random() < 0.2).encode())
            meta.append(kinds)
    with open(args.out, "wb") as f, open(args.out + ".meta", "w") as m:
        f.write(codecs.BOM_UTF8)
        for line, kinds in zip(lines, meta, strict=True):
            tail = rng.choice([b"\n"] * 6 + [b"\r\n", b"\r\n", b"  \n", b"\t\r\n"])
            f.write(line.rstrip(b"\r\n \t") + tail)
            m.write(json.dumps(kinds) + "\n")


if __name__ == "__main__":
    main()
