"""A realistic chat mix for packing benchmarks (issue 23), deterministic (seed 0):

    python tools/make_chat_mix.py OUT.jsonl [ROWS] [--short]

Default: 50% short instructions (one user turn and its answer), 35% medium chats with a system turn, 15% long
multi-turn chats (3-5 exchanges); 2,000 rows measure, in the tiny default's tokens, p10/median/p90/max
208/460/1602/3472 and 5.5% longer than 2,048. --short: instructions only, 94/147/238/506.
Words come from a small vocabulary.
"""

import json
import random
import sys

WORDS = (
    "the a model data gradient token rank batch memory network device update adapter sequence value layer "
    "attention window training loss step answer question explain why how because therefore example result"
).split()


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


if __name__ == "__main__":
    out, rows = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 2000
    rng = random.Random(0)
    with open(out, "w") as f:
        for _ in range(rows):
            f.write(json.dumps({"messages": conversation(rng, "--short" in sys.argv)}) + "\n")
