"""Check 1, edge cases: answers that start or end with what a tokenizer or the template could merge or trim
(combining marks, zero-width and format characters, NEL, CJK ideographic space, ZWJ emoji, code fences).

python bench_results/data-probe/make_adversarial.py  (writes /tmp/dp/adv.jsonl; then check_labels.py on it)
"""

import json

starts = [
    "\u0301abc",
    "\u200bhi",
    "\ufeffhi",
    "▁x",
    "<b>bold</b>",
    "&lt;",
    "\u00a0x\u00a0",
    "x\u3000",
    "\u3000x",
    "\u2028x\u2029",
    "👩‍💻",
    "\\n",
    "  \n\n```py\nx\n```\n\n",
    "a\u0000b",
    "\x85x",
    "x\x85",
    "\x1cx\x1d",
    "\u180ex",
    "e\u0301",
]
with open("/tmp/dp/adv.jsonl", "w") as f:
    for s in starts:
        f.write(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "q" + s},
                        {"role": "assistant", "content": s},
                        {"role": "user", "content": s},
                        {"role": "assistant", "content": "ok " + s},
                    ]
                }
            )
            + "\n"
        )
