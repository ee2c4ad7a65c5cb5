"""A realistic chat mix for packing benchmarks (issue 23) and for probing the data path, deterministic (seed 0):

    python tools/make_chat_mix.py OUT.jsonl [ROWS] [--short] [--messy]

Default: 50% short instructions (one user turn and its answer), 35% medium chats with a system turn, 15% long
multi-turn chats (3-5 exchanges); 2,000 rows measure, in the tiny default's tokens, p10/median/p90/max
208/460/1602/3472 and 5.5% longer than 2,048. --short: instructions only, 94/147/238/506.
Words come from a small vocabulary. --messy adds what users' files hold (bench_results/chat-mix-probe): code
blocks, markdown, non-Latin scripts, emoji and combining marks in 10% of the texts, answers given as text parts
(15%), earlier answers of weight 0 (20%), 2% rows repeated exactly, CRLF line ends and a UTF-8 byte-order mark.
"""

import json
import random
import sys

WORDS = (
    "the a model data gradient token rank batch memory network device update adapter sequence value layer "
    "attention window training loss step answer question explain why how because therefore example result"
).split()
MESSY = [
    "```python\nfor step in range(10):\n    loss = model(batch)\n    loss.backward()\n```\n",
    "\n\n## Heading\n- item one\n- item **two**\n",
    "数据并行训练中每个进程读取自己的分片。",
    "التدريب الموزع يقسم البيانات بين العمليات.",
    "प्रत्येक रैंक अपना हिस्सा पढ़ता है।",
    "🚀🔥 ready? ✅ done 👍🏽",
    "e\u0301te\u0301 cafe\u0301 na\u0308ive",
    "  trailing and leading blanks  ",
]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, words)))


def conversation(rng: random.Random, short: bool) -> list[dict]:
    kind = rng.random()
    if short or kind < 0.5:  # an instruction and its answer
        return [
            {"role": "user", "content": text(rng, int(rng.lognormvariate(3.0, 0.5)))},
            {"role": "assistant", "content": text(rng, int(rng.lognormvariate(4.0 if short else 4.95, 0.5)))},
        ]
    if kind < 0.85:  # a medium chat with a system turn
        return [
            {"role": "system", "content": text(rng, rng.randint(10, 40))},
            {"role": "user", "content": text(rng, int(rng.lognormvariate(3.5, 0.6)))},
            {"role": "assistant", "content": text(rng, int(rng.lognormvariate(5.6, 0.5)))},
        ]
    turns = []  # a long multi-turn chat
    for _ in range(rng.randint(3, 5)):
        turns += [
            {"role": "user", "content": text(rng, int(rng.lognormvariate(3.5, 0.6)))},
            {"role": "assistant", "content": text(rng, int(rng.lognormvariate(5.25, 0.5)))},
        ]
    return turns


def messy(rng: random.Random, messages: list[dict]) -> list[dict]:
    """The same conversation as users' files hold it (its own random stream: the lengths stay the default's)."""
    answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for i, m in enumerate(messages):
        if rng.random() < 0.1:
            words = m["content"].split(" ")
            words.insert(rng.randrange(len(words) + 1), rng.choice(MESSY))
            m["content"] = " ".join(words)
        if m["role"] == "assistant" and rng.random() < 0.15:
            m["content"] = [{"type": "text", "text": m["content"]}, {"type": "text", "text": text(rng, 5)}]
        if m["role"] == "assistant" and i != answers[-1] and rng.random() < 0.2:
            m["weight"] = 0  # an earlier answer kept as context only (the last one always trains)
    return messages


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        raise SystemExit(__doc__)  # never an option taken for the output file
    out, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 2000
    rng, mess = random.Random(0), random.Random(1)
    lines = [{"messages": conversation(rng, "--short" in sys.argv)} for _ in range(rows)]
    if "--messy" in sys.argv:
        lines = [{"messages": messy(mess, row["messages"])} for row in lines]
        for i in mess.sample(range(rows), rows // 50):
            lines[i] = lines[mess.randrange(rows)]
    end = "\r\n" if "--messy" in sys.argv else "\n"
    with open(out, "w", newline="") as f:
        f.write("\ufeff" if "--messy" in sys.argv else "")
        f.writelines(json.dumps(row, ensure_ascii=i % 2 == 0) + end for i, row in enumerate(lines))
