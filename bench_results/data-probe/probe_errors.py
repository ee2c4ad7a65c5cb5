"""Check 5: files users really bring, broken in common ways: the loader's message for each (and grep -n's line of
the bad row, to compare with the line named).

python bench_results/data-probe/probe_errors.py OUT_DIR
"""

import codecs
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import chat_data  # noqa: E402
from guards import InputError  # noqa: E402


def row(answer: str = "Hello.") -> str:
    return json.dumps({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": answer}]})


BOT = json.dumps({"messages": [{"role": "bot", "content": "x"}]})
CASES = {
    # cat a.jsonl b.jsonl, both saved with a BOM by a Windows tool
    "bom-mid-file": codecs.BOM_UTF8 + (row() + "\n" + row() + "\n").encode() + codecs.BOM_UTF8 + row().encode(),
    # rows written twice in Windows text mode, one bad row on line 4
    "cr-cr-lf": ("\r\r\n".join([row(), row(), row(), BOT, row()]) + "\r\r\n").encode(),
    # a JSON array turned into lines by hand: each row keeps its comma
    "trailing-commas": "".join(row() + ",\n" for _ in range(3)).encode(),
    # a Hugging Face dataset cloned without git-lfs: the pointer, not the data
    "git-lfs-pointer": b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 90902539\n",
    # wget of a GitHub/Hub page instead of the raw file
    "html-page": b"<!DOCTYPE html>\n<html lang='en'>\n<head><title>data.jsonl</title></head>\n",
    # UTF-16 without a byte-order mark (some .NET / PowerShell writers)
    "utf16-no-bom": (row() + "\n" + row() + "\n").encode("utf-16-le"),
    # a download cut short: the last row ends mid-string
    "truncated-last-row": (row() + "\n" + row() + "\n" + row("A long answer that was cut"))[:-8].encode(),
    # two rows on one line (a missing line break)
    "two-rows-one-line": (row() + row() + "\n").encode(),
    # an assistant answer given as content null with a refusal
    "refusal": json.dumps(
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "refusal": "No."}]}
    ).encode(),
    # OpenAI 'name' field: dropped by the template without a word
    "name-field": json.dumps(
        {"messages": [{"role": "user", "content": "x", "name": "alice"}, {"role": "assistant", "content": "y"}]}
    ).encode(),
    # only a BOM and blank lines
    "bom-and-blank-lines": codecs.BOM_UTF8 + b"\n\r\n  \n",
    # deeply nested JSON (a broken serializer)
    "deep-nesting": b'{"messages": ' + b"[" * 100000 + b"]" * 100000 + b"}\n",
}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, data in CASES.items():
        path = out / f"{name}.jsonl"
        path.write_bytes(data)
        try:
            rows = chat_data.load_conversations(str(path))
            said = f"loaded {len(rows)} rows"
        except InputError as e:
            said = f"InputError: {e}"
        except Exception as e:  # a crash, not a clear error
            said = f"CRASH {type(e).__name__}: {str(e)[:200]}"
        grep = subprocess.run(["grep", "-c", ""], input=data, capture_output=True).stdout.decode().strip()
        print(f"{name} ({len(data)} bytes, {grep} lines by grep -c):\n    {said[:400]}")


if __name__ == "__main__":
    main()
