"""Chat data: JSONL rows of {"messages": [...]}, validated up front (file, line and field named), rendered
with the tokenizer's chat template into token ids and labels (assistant turns only, or every token)."""

import argparse
import bisect
import codecs
import functools
import hashlib
import inspect
import itertools
import json
import os
import re
import shlex
import sys
import tempfile
import unicodedata
from collections.abc import Sequence
from pathlib import Path

from torch.utils.data import Dataset

from collate import IGNORE_INDEX
from guards import InputError

ROLES = ("system", "user", "assistant")
# roles other formats use, and what to do about them
OTHER_ROLES = {
    "model": "Gemma's own name for 'assistant': rename it",
    "gpt": "ShareGPT's 'assistant': rename it",
    "bot": "rename it 'assistant'",
    "human": "ShareGPT's 'user': rename it",
    "prompter": "OpenAssistant's 'user': rename it",
    "developer": "OpenAI's 'system': rename it",
    **dict.fromkeys(  # OpenAI's, Llama 3's, LLaMA-Factory's, ms-swift's
        ("tool", "function", "ipython", "observation", "tool_response"),
        "tool results are not trained on here: drop the row (without its results, the answer after them would "
        "be trained on text the model never sees)",
    ),
    **dict.fromkeys(("function_call", "tool_call", "tool_calls"), "tool calls are not trained on here: drop the row"),
}
# files people pass for JSONL, by their first bytes (UTF-32's before UTF-16's): what they are, how to get JSONL
NOT_JSONL = {
    b"\x1f\x8b": "gzip-compressed: gzip -dc FILE > OUT.jsonl",
    b"BZh": "bzip2-compressed: bzip2 -dc FILE > OUT.jsonl",
    b"\xfd7zXZ\x00": "xz-compressed: xz -dc FILE > OUT.jsonl",
    b"\x28\xb5\x2f\xfd": "zstd-compressed: zstd -dc FILE > OUT.jsonl",
    b"PK\x03\x04": "a zip archive: unzip -p FILE > OUT.jsonl",
    b"PAR1": "Parquet: pandas.read_parquet('FILE').to_json('OUT.jsonl', orient='records', lines=True)",
    b"\xff\xfe\x00\x00": "UTF-32 text: iconv -f UTF-32 -t UTF-8 FILE > OUT.jsonl",
    b"\x00\x00\xfe\xff": "UTF-32 text: iconv -f UTF-32 -t UTF-8 FILE > OUT.jsonl",
    b"\xff\xfe": "UTF-16 text: iconv -f UTF-16 -t UTF-8 FILE > OUT.jsonl",
    b"\xfe\xff": "UTF-16 text: iconv -f UTF-16 -t UTF-8 FILE > OUT.jsonl",
    b"{\x00": "UTF-16 text without a byte-order mark: iconv -f UTF-16LE -t UTF-8 FILE > OUT.jsonl",  # a row's '{'
    b"\x00{": "UTF-16 text without a byte-order mark: iconv -f UTF-16BE -t UTF-8 FILE > OUT.jsonl",
    # what a download or clone gives instead of the data
    b"version https://git-lfs.github.com/spec/": "a Git LFS pointer (cloned without git-lfs): git lfs pull, or "
    "download the file itself",
    **dict.fromkeys(
        (b"<!DOCTYPE html", b"<!doctype html", b"<html"), "an HTML page (a web page saved): download the raw file"
    ),
}


def load_conversations(path: str, control_tokens: Sequence[str] = (), model_id: str = "") -> list[list[dict]]:
    """Parse and validate every row up front, so bad data fails on every rank before training starts; the first
    bad row is named, with the count and lines of the others (and, where some rows pass, the command that keeps
    them: python chat_data.py). A UTF-8 byte-order mark is skipped (at the start of any line: files joined with
    cat keep theirs); content given as a list of text parts stays a list, for the chat template to join
    (template_messages). Text that spells one of the tokenizer's `control_tokens` (control_tokens()) is refused:
    the tokenizer would read it as that token, a fake turn or end of text inside a message. `model_id`: whose
    tokenizer that is, for the command."""
    lines = file_lines(path)
    rows, bad, empty, control = row_verdicts(lines, path, control_tokens)
    passing = len(rows.keys() - set(empty) - control.keys())  # (a bad row never parsed)
    model = f" --model {shlex.quote(model_id)}" if model_id else ""  # whose control tokens
    command = f"python {shlex.quote(os.path.relpath(__file__))} {shlex.quote(path)} OUT.jsonl{model}"
    keep = f"; or keep the {passing} rows that pass: {command}" if passing else ""
    if bad:
        first, more = next(iter(bad.values())), list(bad)[1:]
        raise InputError(
            first + (f" (and {len(more)} more bad row(s): lines {first_lines(more)})" if more else "") + keep
        )
    if empty:
        raise InputError(
            f"{path}:{empty[0]}: an assistant turn with empty content, in {len(empty)} row(s) (lines "
            f"{first_lines(empty)}); drop those rows: training on an empty answer teaches the model to stop at once"
            + keep
        )
    if thinking := next((n for n, (_, token) in control.items() if token == "<|channel>"), None):
        raise InputError(
            f"{path}:{thinking}: messages[{control[thinking][0]}] holds a thinking block ('<|channel>...<channel|>'), "
            f"which Gemma 4's template leaves out of a conversation's history: remove the block to train on the "
            f"answer alone, or drop the row"
        )
    if control:
        lineno, (j, token) = next(iter(control.items()))
        drop = " ".join(f"-e {shlex.quote(t)}" for t in sorted({t for _, t in control.values()}))
        raise InputError(
            f"{path}:{lineno}: messages[{j}] has {token!r} in its text, which the tokenizer reads as that control "
            f"token, not as text; in {len(control)} row(s) (lines {first_lines(list(control))}): rewrite them, or "
            f"drop them: grep -vF {drop} {shlex.quote(path)} > OUT.jsonl"
        )
    if not rows:
        raise InputError(f"{path}: no examples (the file is {'empty' if lines == [b''] else 'blank'})")
    return list(rows.values())


def file_lines(path: str) -> list[bytes]:
    """The lines of the data file `path`, after the checks of the file as a whole (a pipe, not readable,
    compressed or another format)."""
    if path.startswith(("/dev/fd/", "/proc/self/fd/")) or (Path(path).exists() and not Path(path).is_file()):
        if not Path(path).is_dir():  # a pipe gives its data once, and torchrun does not pass a <(...) on to its ranks
            raise InputError(f"{path}: not a regular file (a pipe or <(...)?): write the data to a file first")
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"cannot read data file {path}: {e}") from e
    for magic, what in NOT_JSONL.items():
        if data.startswith(magic):
            command = what.replace("'FILE'", repr(str(path))).replace("FILE", shlex.quote(str(path)))  # pastes as is
            raise InputError(f"{path}: not JSON Lines but {command}")
    if Path(path).suffix.lower() in (".csv", ".tsv") and data.removeprefix(codecs.BOM_UTF8).lstrip()[:1] != b"{":
        raise InputError(
            f'{path}: {Path(path).suffix[1:].upper()}, not JSON Lines: write one {{"messages": [...]}} object per '
            f"line (pandas: read_csv, make a 'messages' column of lists, to_json('OUT.jsonl', orient='records', "
            f"lines=True))"
        )
    # Lines end at LF, as grep -n and sed -n count them: splitlines() also broke at every CR, so a row ending in
    # CR CR LF (CRLF text written again in Windows text mode) or a raw CR inside a string shifted every later line
    # number named. A file of CR-only line ends (classic Mac) is split at its CRs.
    return data.split(b"\n") if b"\n" in data else data.split(b"\r")


def row_verdicts(lines: list[bytes], path: str, control_tokens: Sequence[str]) -> tuple[dict, dict, list, dict]:
    """Each row's verdict, by line number: (the rows that parse, {line: messages}; the bad ones, {line: error};
    the lines of rows with an empty answer; {line: (message, control token it spells)})."""
    control_text = any_of(control_tokens)
    rows, bad, empty, control = {}, {}, [], {}
    for lineno, raw in enumerate(lines, 1):
        raw = raw.removeprefix(codecs.BOM_UTF8)
        if not raw.strip():
            continue
        if not rows and not bad and raw.lstrip().startswith(b"["):
            raise InputError(
                f"{path}:{lineno}: a JSON array; this script reads JSON Lines, one object per line. Convert: "
                f'python -c "import json,sys; [print(json.dumps(r)) for r in json.load(open(sys.argv[1]))]" '
                f"{shlex.quote(str(path))} > OUT.jsonl"
            )
        try:
            messages = checked_row(raw, path, lineno)
        except InputError as e:
            bad[lineno] = str(e)
            continue
        if any(m["role"] == "assistant" and m.get("weight", 1) and not visible(text_of(m)) for m in messages):
            empty.append(lineno)
        for j, m in enumerate(messages):
            glued = "" if isinstance(m["content"], str) else "".join(p["text"].strip() for p in m["content"])
            if found := control_text.search(text_of(m)) or control_text.search(glued):  # parts a template glues
                control.setdefault(lineno, (j, found[0]))
        rows[lineno] = messages
    return rows, bad, empty, control


def keep_passing_rows(path: str, out: str, control_tokens: Sequence[str]) -> str:
    """Write the rows of `path` that pass load_conversations' checks to `out`, each line as it was (atomically: a
    whole file or none); returns how many were kept, and why the others were not, by reason."""
    if Path(out).resolve() == Path(path).resolve():
        raise InputError(f"{out}: the output would overwrite the data: name another file")
    lines = file_lines(path)
    rows, bad, empty, control = row_verdicts(lines, path, control_tokens)
    why = {  # by kind: not where in the row (the message, the column) it is
        n: re.sub(r"^messages\[\d+\]: | at column \d+", "", error.removeprefix(f"{path}:{n}: "))
        for n, error in bad.items()
    }
    why |= {n: "an assistant turn with empty content" for n in empty}
    why |= {
        n: f"{token!r} in the text, which the tokenizer reads as a control token" for n, (_, token) in control.items()
    }
    if not rows.keys() - why.keys():
        raise InputError(f"{path}: no row passes; the first: {next(iter(why.values()), 'the file is blank')}")
    partial = Path(f"{out}.partial")
    try:
        partial.write_bytes(b"".join(lines[n - 1] + b"\n" for n in rows if n not in why))
        os.replace(partial, out)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise InputError(f"{out}: cannot write it: {e.strerror}") from None
    by_reason: dict[str, list[int]] = {}
    for n in sorted(why):
        by_reason.setdefault(why[n], []).append(n)
    refused = sorted(by_reason.items(), key=lambda item: -len(item[1]))
    return f"{out}: {len(rows.keys() - why.keys())} of {len(rows) + len(bad)} rows kept" + "".join(
        f"\n  {len(at)} left out: {reason} (lines {first_lines(at)})" for reason, at in refused
    )


def checked_row(raw: bytes, path: str, lineno: int) -> list[dict]:
    """One JSON Lines row (`raw`, line `lineno` of `path`) as its list of checked messages."""
    where = f"{path}:{lineno}"
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); save the file as UTF-8"
        ) from None
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(
            f"{where}: not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno}){json_hint(line, e, path)}"
        ) from None
    messages = row.get("messages") if isinstance(row, dict) else None
    if not isinstance(messages, list) or not messages:
        raise InputError(f"{where}: expected an object with a non-empty 'messages' list{format_hint(row)}")
    messages = [checked_message(m, f"{where}: messages[{j}]") for j, m in enumerate(messages)]
    texts = "\n".join(map(text_of, messages))  # a row-level text a message holds already (a Dolly context) is no loss
    unsaid = [f for f in ROW_NOT_RENDERED if row.get(f) and not (isinstance(row[f], str) and row[f].strip() in texts)]
    if unsaid:
        raise InputError(
            f"{where}: has a row-level {unsaid[0]!r}, which is not rendered; {ROW_NOT_RENDERED[unsaid[0]]}"
        )
    if messages[0]["role"] == "assistant":
        raise InputError(f"{where}: messages[0] is from the assistant; a conversation starts with system or user")
    if not any(m["role"] == "assistant" for m in messages):
        raise InputError(f"{where}: no assistant message, nothing to train on")
    if j := next(
        (j for j in range(1, len(messages)) if messages[j - 1]["role"] == messages[j]["role"] == "assistant"), 0
    ):
        raise InputError(  # Gemma 4's template renders the second inside the first's turn: no answer of its own
            f"{where}: messages[{j - 1}] and [{j}] are both from the assistant: merge them into one answer"
        )
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
        raise InputError(f"{where}: every assistant message has weight 0, nothing to train on")
    return messages


def visible(text: str) -> bool:
    """Whether `text` shows anything: not only white space, invisible format characters (zero-width space, word
    joiner, byte-order mark) and control characters (NUL)."""
    return any(not ch.isspace() and unicodedata.category(ch) not in ("Cf", "Cc") for ch in text)


def first_lines(lines: list[int]) -> str:
    return ", ".join(map(str, lines[:5])) + (", ..." if len(lines) > 5 else "")


def control_tokens(tokenizer) -> list[str]:
    """The tokenizer's special tokens (<bos>, <eos>, turn markers, media placeholders): in a message's text, it
    would read each as that token. Whitespace is left out: it is text wherever it stands."""
    return [
        token.content for token in tokenizer.added_tokens_decoder.values() if token.special and token.content.strip()
    ]


def any_of(words: Sequence[str]) -> re.Pattern:
    """A regex matching any of `words`, written as a trie (shared prefixes once): re tries a flat alternation's
    every branch at every position, which with a tokenizer's thousands of special tokens (reserved, unused)
    scans a gigabyte of chat text in half an hour; the trie's branches fail at their first character."""
    trie: dict = {}
    for word in words:
        node = trie
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}  # a word ends here

    def pattern(node: dict) -> str:
        branches = [re.escape(char) + pattern(child) for char, child in node.items() if char]
        if not branches:
            return ""
        grouped = branches[0] if len(branches) == 1 and "" not in node else f"(?:{'|'.join(branches)})"
        return grouped + ("?" if "" in node else "")

    return re.compile(pattern(trie) or "(?!)")  # no words: a pattern that never matches


# message fields the chat template does not render: training would leave their text out without a word
NOT_RENDERED = {
    **dict.fromkeys(("tool_calls", "function_call"), "tool calls are not trained on here: drop the row"),
    "tool_responses": "tool results are not trained on here: drop the row (Gemma 4's template renders them inside "
    "the answer, which would train the model to write them itself)",
    **dict.fromkeys(
        ("reasoning_content", "reasoning", "thinking"),
        "thinking traces are not trained on here (Gemma 4's template renders them only on answers after the last "
        "user message, and drops them from earlier turns): drop the field to train on the answer alone, or drop "
        "the row",
    ),
}
# ... and keys beside "messages" that would change what the model sees, dropped without a word otherwise
ROW_NOT_RENDERED = {
    "system": "make it the first message, {'role': 'system', 'content': ...}",
    **dict.fromkeys(
        ("tools", "functions"),
        "tool definitions are not trained on here: drop the key to train without them, or drop the row",
    ),
    **dict.fromkeys(
        ("images", "image", "audios", "audio", "videos", "video"),
        "this script trains on text: drop the row (its answer speaks of media the model would not see)",
    ),
    **dict.fromkeys(
        ("documents", "context"),
        "put the text the answer draws on into the conversation (e.g. the user's message), or drop the key if a "
        "message holds it already, or drop the row",
    ),
}


TRAIN_FLAGS = ("training", "train", "loss")  # axolotl's and ms-swift's names for weight, as true/false
TEXT_PARTS = ("text", "input_text", "output_text")  # chat completions' text part; the Responses API's two
# parts that carry what the answer is about: without them it would be trained on what the model never sees
MEDIA_PARTS = ("image", "image_url", "input_image", "audio", "input_audio", "video", "file", "input_file", "document")
# tool calls and results as parts or items (Anthropic's, the Responses API's, Gemini's): dropping the part alone
# would train the answer after them on results the model never sees
TOOL_PARTS = {
    "tool_use",
    "tool_result",
    "server_tool_use",
    "web_search_tool_result",
    "mcp_tool_use",
    "mcp_tool_result",
    "function_call",
    "function_call_output",
    "functionCall",
    "functionResponse",
}


def checked_message(m, where: str) -> dict:
    """One message as {"role", "content", ...}: content a string, or a list of text parts, each made
    {"type": "text", "text": ...} (the Responses API's input_text and output_text too: Gemma 4's template renders
    only "text"; a bare string or untyped {"text"} part is text too). OpenAI's "weight" (0: an answer shown, not
    trained on) is kept; other trainers' flags for it (axolotl's "training" or "train", ms-swift's "loss": false)
    become it; a weight of 0 on a turn never trained on (SlimOrca marks them so) is dropped."""
    if not isinstance(m, dict):
        raise InputError(f"{where}: {json.dumps(m)[:40]} is not a message: expected {{'role': ..., 'content': ...}}")
    if "role" not in m and m.get("type") in TOOL_PARTS:  # a Responses API item
        raise InputError(f"{where}: a {m['type']!r} item; tool calls and results are not trained on here: drop the row")
    if "role" not in m:  # another shape of message ({"from", "value"}, {"type", "data"})
        raise InputError(missing_key("role", m, where))
    if m.get("role") not in ROLES:
        role = m.get("role")
        known = str(role).lower()
        hint = f"; {OTHER_ROLES[known]}" if known in OTHER_ROLES else f"; rename it {known!r}" if known in ROLES else ""
        raise InputError(f"{where}: unknown role {role!r} (expected one of {', '.join(ROLES)}){hint}")
    if field := next((f for f in NOT_RENDERED if m.get(f)), None):
        raise InputError(f"{where}: has {field!r}, which the chat template does not render; {NOT_RENDERED[field]}")
    if "weight" in m and m["weight"] is None:  # not set (a datasets export writes null for a missing field)
        m = {k: v for k, v in m.items() if k != "weight"}
    if flag := next((f for f in TRAIN_FLAGS if isinstance(m.get(f), bool)), None):
        if m.get("weight", int(m[flag])) != int(m[flag]):
            raise InputError(f"{where}: 'weight' {m['weight']!r} and {flag!r} {m[flag]!r} disagree: keep one")
        m = {**{k: v for k, v in m.items() if k not in TRAIN_FLAGS}, "weight": int(m[flag])}
    if m["role"] != "assistant" and m.get("weight", 1) == 0:  # not trained on anyway
        m = {k: v for k, v in m.items() if k != "weight"}
    if "weight" in m and (m["role"] != "assistant" or m["weight"] not in (0, 1)):
        on = "" if m["role"] == "assistant" else f" on a {m['role']} message"
        raise InputError(
            f"{where}: 'weight' {m['weight']!r}{on}; it is 0 or 1, on assistant messages "
            f"(0: the answer is context, not trained on)"
        )
    content = m.get("content")
    if isinstance(content, list):
        for k, part in enumerate(content):
            if isinstance(part, str) or (isinstance(part, dict) and part.keys() == {"text"}):  # text, untyped
                part = {"type": "text", "text": part if isinstance(part, str) else part["text"]}
                content = [*content[:k], part, *content[k + 1 :]]
            text_part = isinstance(part, dict) and part.get("type") in TEXT_PARTS
            if text_part and not isinstance(part.get("text"), str):
                raise InputError(f"{where}: content[{k}] is a text part whose 'text' is not a string")
            if not text_part:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if isinstance(part, dict) and kind is None:  # Gemini's parts are keyed by kind
                    kind = next((key for key in part if key in TOOL_PARTS), None)
                drop = (
                    "the row (the answer would be trained without it)"
                    if kind in MEDIA_PARTS
                    else "the row (tool calls and results are not trained on here; the answer after them would be "
                    "trained on results the model never sees)"
                    if kind in TOOL_PARTS
                    else "that part or the row"
                )
                raise InputError(
                    f"{where}: content[{k}] is {kind!r}; only text parts ({{'type': 'text', 'text': ...}}) "
                    f"can be trained on here: drop {drop}"
                )
        content = [{"type": "text", "text": part["text"]} for part in content]
    if content is None and m.get("refusal"):
        raise InputError(f"{where}: a refusal in 'refusal', with 'content' null: put the refusal's text in 'content'")
    if "content" not in m:  # e.g. Gemini's "parts", or the text under "text" or "value"
        raise InputError(missing_key("content", m, where))
    if not isinstance(content, str | list):
        raise InputError(
            f"{where}: 'content' is {json.dumps(content)[:40]}; it must be a string (or a list of text parts)"
        )
    m = {**m, "content": content}
    try:
        text_of(m).encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(
            f"{where}: 'content' has a lone surrogate ({text_of(m)[e.start]!r} at character {e.start + 1}), which "
            f"is not Unicode text: a broken \\u escape in the JSON; fix or drop the row"
        ) from None
    return m


def text_of(message: dict) -> str:
    """A checked message's text, its parts one per line: for the checks here (the chat template joins parts its
    own way: template_messages)."""
    content = message["content"]
    return content if isinstance(content, str) else "\n".join(part["text"] for part in content)


@functools.cache
def renders_parts(tokenizer, chat_template: str, role: str) -> bool:
    """Whether `chat_template` (the tokenizer's, as text: the cache's key) renders a `role` message's content
    given as a list of text parts (Gemma 4's does), rather than failing or printing the list itself (one that
    takes strings only: the tiny model's)."""
    parts = [{"type": "text", "text": "Q7f1"}, {"type": "text", "text": "Z3k9"}]
    before = [{"role": "user", "content": "x"}] if role == "assistant" else []
    after = [{"role": "user", "content": "x"}] if role == "system" else []
    try:
        text = tokenizer.apply_chat_template([*before, {"role": role, "content": parts}, *after], tokenize=False)
    except Exception:  # the template's own error on a list: it takes strings
        return False
    return "Q7f1" in text and "Z3k9" in text and "type" not in text


def template_messages(tokenizer, messages: list[dict]) -> list[dict]:
    """The messages as the chat template is given them: text parts as the list they are where the template
    renders lists, so it joins them as it does for a server's request (Gemma 4's trims each part and joins them
    with nothing; the first system message's with a space after each); else joined one per line, as vLLM joins
    them for a template that takes strings."""
    return [
        m
        if isinstance(m["content"], str) or renders_parts(tokenizer, str(tokenizer.chat_template), m["role"])
        else {**m, "content": text_of(m)}
        for m in messages
    ]


def missing_key(key: str, message: dict, where: str) -> str:
    return f"{where}: no {key!r} (its keys: {', '.join(map(str, message))}); a message is {{'role', 'content'}}"


def json_hint(line: str, error: json.JSONDecodeError, path: str) -> str:
    """What a line that is not JSON most likely is, and what to do."""
    if line.lstrip().startswith(("//", "#")):
        return "; a comment line: JSON Lines has no comments, delete it"
    if error.msg == "Extra data":  # a whole object, then more: what a hand-made conversion leaves
        rest = line[error.pos :].strip()
        if rest == ",":
            return (
                f"; a comma after the object (left from a JSON array): sed 's/,\\s*$//' {shlex.quote(path)} > OUT.jsonl"
            )
        if rest.startswith("{"):
            return "; a second object on the same line: each row goes on its own line"
    if not line.strip("\x00 \t\r\x1a"):  # what a crash or a DOS editor leaves after the last row
        return "; only NUL or end-of-file (^Z) bytes: the tail of a file cut short, delete it"
    if line.lstrip().startswith("{'"):
        return "; Python's repr of a dict (single quotes), not JSON: write each row with json.dumps(row)"
    if "control character" in error.msg:
        if line[error.pos] not in "\t\n\r":
            return f"; a raw control byte (0x{ord(line[error.pos]):02x}) inside a string: remove it"
        return "; a raw tab or line break inside a string: write it escaped (\\t, \\n)"
    if line.strip() in ("{", "}") or re.match(r'\s*"[^"]*"\s*:', line):
        return (
            f"; this looks like JSON spread over several lines: write one object per line, e.g. "
            f"jq -c . {shlex.quote(path)} > OUT.jsonl"
        )
    return ""


def format_hint(row) -> str:
    """How to turn the other formats people bring into 'messages' rows."""
    if isinstance(row, str) and row.lstrip().startswith("{"):
        return "; the row is a JSON string holding an object: it was encoded twice (json.loads it once more)"
    if not isinstance(row, dict):
        return ""
    if isinstance(row.get("messages"), str) and row["messages"].lstrip().startswith("["):
        return "; its 'messages' is JSON text, not a list: it was encoded twice (json.loads it once more)"
    for key in ("conversations", "conversation", "message", "chat", "dialog"):
        turns = row.get(key)
        if isinstance(turns, list) and turns and all(isinstance(t, dict) and "from" in t for t in turns):
            return (
                f"; this looks like ShareGPT: rename {key!r} to 'messages', 'from' to 'role' and 'value' to "
                f"'content', with roles human -> user, gpt -> assistant"
            )
        if isinstance(turns, list):
            return f"; it has {key!r}: rename that key to 'messages'"
    if isinstance(row.get("messages"), dict):
        if row["messages"] and all(str(k).isdigit() for k in row["messages"]):  # {"0": [...], "1": [...]}
            return (
                "; this is pandas' default to_json layout: write df.to_json('OUT.jsonl', orient='records', lines=True)"
            )
        return "; its 'messages' is one object: make it a list of messages, [...]"
    for key, rows in row.items():
        if isinstance(rows, list) and rows and all(isinstance(r, dict) and "messages" in r for r in rows):
            return f"; the rows are a list under {key!r}: jq -c '.{key}[]' FILE > OUT.jsonl, one row per line"
    if {"prompt", "completion"} <= row.keys() and isinstance(row["prompt"], list):
        return (
            "; this looks like conversational prompt/completion (lists of messages): write "
            '{"messages": prompt + completion}'
        )
    if {"chosen", "rejected"} <= row.keys():
        return (
            "; this looks like a preference pair (chosen/rejected, for DPO-style training): for fine-tuning on the "
            "chosen answer, write {\"messages\": [...the prompt's messages, then chosen's]}"
        )
    if {"instruction", "output"} <= row.keys():
        return (
            '; this looks like Alpaca: write {"messages": [{"role": "user", "content": instruction, then a blank line '
            'and input if any}, {"role": "assistant", "content": output}]}'
        )
    if {"prompt", "completion"} <= row.keys():
        return (
            '; this looks like prompt/completion: write {"messages": [{"role": "user", "content": prompt}, '
            '{"role": "assistant", "content": completion}]} (the loss then covers the completion only)'
        )
    return ""


def chat_tokenizer(model_id: str):
    """MODEL_ID's tokenizer, which renders every conversation with its chat template. Without one (a base,
    pre-trained checkpoint's tokenizer) no row can be rendered: said here, before any row is read."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_id)
    except (OSError, ValueError) as e:  # a tokenizer file missing or damaged
        why = next(iter(str(e).strip().splitlines()), type(e).__name__)
        raise InputError(f"MODEL_ID {model_id!r}: cannot load its tokenizer: {why}") from e
    if not tokenizer.chat_template:
        raise InputError(
            f"MODEL_ID {model_id!r}: its tokenizer has no chat template to render the conversations with (a base "
            "checkpoint?); use the instruction-tuned model's tokenizer, e.g. google/gemma-4-12B-it"
        )
    return tokenizer


END_OF_TURN = "<turn|>"  # Gemma 4's end of a turn: the last token an answer is trained to produce


@functools.cache
def answer_cue(tokenizer) -> tuple[str, str]:
    """How the chat template opens an assistant turn: (the header that the turn, rendered as history, starts
    with; the text the generation prompt adds after that header). The templates of Gemma 4's larger checkpoints
    end the generation prompt with an empty thought block ('<|channel>thought\\n<channel|>', thinking off) that
    their history drops (the tiny model's template does too); other templates add nothing. Read off a probe
    conversation."""
    user = [{"role": "user", "content": "x"}]
    before = tokenizer.apply_chat_template(user, tokenize=False)
    prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)[len(before) :]
    turn = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": "y"}], tokenize=False)
    header = os.path.commonprefix([prompt, turn[len(before) :]])
    return header, prompt[len(header) :]


def training_text(tokenizer, messages: list[dict], chars: int | None = None) -> tuple[str, list[tuple[int, int]]]:
    """The conversation as it is trained on, and the character spans of its answers (each assistant turn's text
    through its end-of-turn marker; none for a turn of weight 0). That is the template's rendering, with each
    assistant turn opened as the generation prompt opens it: what the model sees at inference before it answers
    (answer_cue; the text put in is not a target). With `chars`, only the text's first `chars` characters are
    made, from the first messages that reach them: a trace of a thousand turns costs what MAX_LEN keeps of it."""
    render = functools.partial(tokenizer.apply_chat_template, tokenize=False)
    messages, history = rendered_head(render, template_messages(tokenizer, messages), chars)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    places = marked_answer_places(render, tokenizer, messages, history, turns) if len(turns) > 2 else None
    if places is None:  # few answers, or the template alters the marks: each placed by rendering up to it
        places = [answer_place(render, tokenizer, messages, history, i) for i in turns]
    pieces, answers, copied, shift = [], [], 0, 0  # characters of `history` taken so far; characters put in
    for i, (start, end, _, extra) in zip(turns, places, strict=True):
        pieces += [history[copied:start], extra]
        copied, shift = start, shift + len(extra)
        if messages[i].get("weight", 1):
            answers.append((start + shift, end + shift))
    text = "".join(pieces) + history[copied:]
    return (text, answers) if chars is None else (text[:chars], [a for a in answers if a[0] < chars])


def rendered_head(render, messages: list[dict], chars: int | None) -> tuple[list[dict], str]:
    """The first messages whose rendering is `chars` characters or more (all of them without `chars`), and that
    rendering: a prefix of the whole chat's, the template being prefix-stable (answer_place checks it)."""
    totals = list(itertools.accumulate(len(text_of(m)) for m in messages))
    k = len(messages) if chars is None else bisect.bisect_left(totals, chars) + 1
    while True:
        history = render(messages[:k])
        if k >= len(messages) or len(history) >= chars:
            return messages[:k], history
        k *= 2


def answer_place(render, tokenizer, messages: list[dict], history: str, i: int) -> tuple[int, int, str, str]:
    """Where answer `i` starts and ends in `history` (the chat rendered), the header that opens its turn there,
    and the text the generation prompt adds after that header (answer_cue), found by rendering the chat up to
    the answer (and through it, and with the generation prompt)."""
    before, through = render(messages[:i]), render(messages[: i + 1])
    cue = render(messages[:i], add_generation_prompt=True).removeprefix(before)
    if not (history.startswith(through) and through.startswith(before)):
        raise InputError("chat template is not prefix-stable; cannot locate assistant turns")
    turn = through[len(before) :]
    header, extra = (cue, "") if turn.startswith(cue) else answer_cue(tokenizer)
    if header + extra != cue or not turn.startswith(header):
        raise InputError(
            f"the chat template's generation prompt ({cue!r}) does not open the assistant turn as its history "
            f"does ({turn[:40]!r}...): cannot place the answer"
        )
    marker = turn.rfind(END_OF_TURN)
    end = len(before) + (marker + len(END_OF_TURN) if marker >= len(header) else len(turn))
    return len(before) + len(header), end, header, extra


MARK = "\ue000"  # a private-use character: brackets each message's number in marked_answer_places' rendering


def marked_answer_places(render, tokenizer, messages: list[dict], history: str, turns: list[int]) -> list | None:
    """answer_place() of every answer in `turns`, from one more rendering instead of three per answer (quadratic
    in turns, and Gemma 4's template costs about a millisecond a message): each message's text carries its number
    in marks before its first visible character, so the marks say where each text starts in `history`. None when
    a text holds the mark or the template does not pass the marks through unchanged, or an answer's text starts
    as the generation prompt's addition does; the first and last answers are placed by answer_place() as well,
    and anything else than the same places is None too."""
    if any(MARK in text_of(m) for m in messages):
        return None
    marked = render([{**m, "content": with_mark(m["content"], j)} for j, m in enumerate(messages)]).split(MARK)
    texts, numbers = marked[0::2], marked[1::2]
    if numbers != [str(j) for j in range(len(messages))] or "".join(texts) != history:
        return None
    starts = [*itertools.accumulate(map(len, texts[:-1])), len(history)]  # each text's start; then the end
    first = answer_place(render, tokenizer, messages, history, turns[0])
    header, extra = first[2], first[3]
    places = []
    for i in turns:
        end = history.rfind(END_OF_TURN, starts[i], starts[i + 1])
        if end < 0 or history[starts[i] - len(header) : starts[i]] != header:
            return None
        if extra and history.startswith(extra, starts[i]):  # answer_place would take it for the history's cue
            return None
        places.append((starts[i], end + len(END_OF_TURN), header, extra))
    same = places[0] == first and places[-1] == answer_place(render, tokenizer, messages, history, turns[-1])
    return places if same else None


def with_mark(content, number: int):
    """`content` (a text, or text parts) with `number` in marks before its first visible character: where a
    template trims the text, the mark is where the text starts."""
    if isinstance(content, list):
        return [{**content[0], "text": with_mark(content[0]["text"], number)}, *content[1:]]
    visible_part = content.lstrip()
    return f"{content[: len(content) - len(visible_part)]}{MARK}{number}{MARK}{visible_part}"


HEAD_CHARS_PER_TOKEN = 8  # a first cut of a long text, in characters per token kept (a token is about 4)


def encode_head(tokenizer, messages: list[dict], max_len: int) -> tuple[list[int], list[tuple[int, int]], list]:
    """The first max_len tokens of the conversation's training_text(), their character offsets and the answers'
    spans, as making and tokenizing all of it gives them, without making or tokenizing all of it: a row of
    megabytes (a log or a book pasted into one turn) would cost seconds and gigabytes on every fetch, a trace of
    a thousand turns seconds. Longer and longer heads are made and tokenized until the tokens kept end in the
    first three quarters of one (a cut changes only the tokens near it)."""
    cut = HEAD_CHARS_PER_TOKEN * max_len
    while True:
        text, answers = training_text(tokenizer, messages, cut)
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)  # text has its <bos>
        ids, offsets = encoded["input_ids"][:max_len], encoded["offset_mapping"][:max_len]
        if head_settled(text, offsets, cut, max_len):
            return ids, offsets, answers
        cut *= 2


def head_settled(text: str, offsets: list[tuple[int, int]], cut: int, max_len: int) -> bool:
    """Whether the first max_len tokens of `text` (the first `cut` characters of a row's text; `offsets` theirs)
    are the row's: the text is whole, or they end in its first three quarters (a cut changes only the tokens
    near it)."""
    return len(text) < cut or (len(offsets) >= max_len and offsets[max_len - 1][1] <= cut * 3 // 4)


def tokenize_conversation(tokenizer, messages: list[dict], max_len: int, assistant_only: bool) -> dict:
    """Token ids and labels for one conversation (training_text(), tokenized up to max_len). With assistant_only,
    labels are -100 except on the tokens of each answer (a token that spans its first character included)."""
    input_ids, offsets, answers = encode_head(tokenizer, messages, max_len)
    if not assistant_only:
        labels = list(input_ids)
    else:
        labels, spans = [IGNORE_INDEX] * len(input_ids), iter(answers)
        span = next(spans, None)
        for j, (first, last) in enumerate(offsets):
            while span is not None and span[1] <= first:
                span = next(spans, None)
            if span is not None and first < span[1] and span[0] < last:
                labels[j] = input_ids[j]
    return {"input_ids": input_ids, "labels": labels}


class ChatDataset(Dataset):
    """Conversations tokenized lazily (in DataLoader workers), so skipped samples cost nothing."""

    def __init__(
        self,
        conversations,
        tokenizer,
        max_len: int,
        assistant_only: bool,
        lengths_file: Path | None = None,
        writes_lengths: bool = True,
    ):
        self.conversations, self.tokenizer = conversations, tokenizer
        self.max_len, self.assistant_only = max_len, assistant_only
        self.lengths_file, self.writes_lengths = lengths_file, writes_lengths
        self.lengths = [sum(len(text_of(m)) for m in c) for c in conversations]  # characters: no tokenizing

    def __len__(self):
        return len(self.conversations)

    def __getitem__(self, i):
        return tokenize_conversation(self.tokenizer, self.conversations[i], self.max_len, self.assistant_only)

    @functools.cached_property
    def token_lengths(self) -> list[int]:
        """Every conversation's tokens, at most max_len (what packing needs before the first step). A full pass
        over 100k rows of the sample's kind takes about 80 s on 2 cores (the chat template rendered for each
        turn, the texts tokenized in batches), so it is kept in `lengths_file` (named by lengths_file()) for the
        next run or resume on the same data. Only a dataset that `writes_lengths` writes it: one per node, so a
        file written by a faster peer in this same run cannot hide from rank 0 that the run is counting."""
        if self.lengths_file is not None and self.lengths_file.exists():
            try:
                kept = json.loads(self.lengths_file.read_text())
            except ValueError:  # damaged outside this script (it writes whole files): counted again
                kept = None
            if isinstance(kept, list) and len(kept) == len(self.conversations):
                return kept
        lengths, cut = [], HEAD_CHARS_PER_TOKEN * self.max_len
        for at in range(0, len(self.conversations), 1024):  # batched: the tokenizer's threads share the work
            rows = self.conversations[at : at + 1024]
            texts = [training_text(self.tokenizer, c, cut)[0] for c in rows]  # whole when shorter than the cut
            heads = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
            lengths += [
                min(len(head), self.max_len)
                if head_settled(text, head, cut, self.max_len)
                else len(encode_head(self.tokenizer, row, self.max_len)[0])  # a longer head, made again
                for text, head, row in zip(texts, heads, rows, strict=True)
            ]
        if self.lengths_file is not None and self.writes_lengths:  # the rename makes it whole or absent
            fd, partial = tempfile.mkstemp(dir=self.lengths_file.parent, prefix=f"{self.lengths_file.name}.")
            with os.fdopen(fd, "w") as f:  # a name of its own: nodes' containers can share pids and storage
                f.write(json.dumps(lengths))
            os.replace(partial, self.lengths_file)
        return lengths


def tokenizer_sha256(tokenizer) -> str:
    """What tells tokenizers apart for training: their vocabulary and rules, and their chat template."""
    return hashlib.sha256(f"{tokenizer.backend_tokenizer.to_str()}\0{tokenizer.chat_template}".encode()).hexdigest()


def lengths_file(output_dir: str, data_sha256: str, tokenizer, max_len: int) -> Path:
    """Where ChatDataset.token_lengths are kept, named by what they depend on: the data, the tokenizer
    (tokenizer_sha256), MAX_LEN, and the code that makes a row's text (lengths an older version counted would
    overfill packed rows)."""
    makers = (training_text, rendered_head, answer_place, marked_answer_places, with_mark, template_messages)
    code = "".join(map(inspect.getsource, (*makers, encode_head, head_settled, ChatDataset.token_lengths.func)))
    parts = [data_sha256, tokenizer_sha256(tokenizer), str(max_len), code]
    return Path(output_dir) / f"token_lengths-{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:16]}.json"


SUMMARY_SPAN = 2  # data_summary counts the target tokens MAX_LEN cuts within this many times MAX_LEN a row


def data_summary(dataset: ChatDataset, epoch_data, used_per_epoch: int, path: str, sample_size: int = 1000) -> str:
    """How many rows repeat an earlier one (each copy trains again: a file concatenated twice is a common slip);
    what the dataset's max_len (MAX_LEN) and drop_last do to the data, from up to `sample_size` rows spread over
    the file (the same rows on every rank; this also checks the chat template); and with packing how full the
    first epoch's rows are (`epoch_data`: its packed rows, else the dataset). Stops when no sampled row keeps a
    target."""
    rows, max_len = dataset.conversations, dataset.max_len
    distinct = set(map(row_key, rows))
    repeated = f" ({len(rows) - len(distinct)} repeat an earlier row exactly)" if len(distinct) < len(rows) else ""
    sample = spread(rows, sample_size)
    cut = targets = kept = no_target = 0
    for messages in sample:
        row_cut, row_targets, row_kept = row_targets_kept(dataset, messages)
        cut, targets, kept, no_target = (
            cut + row_cut,
            targets + row_targets,
            kept + row_kept,
            no_target + (row_kept == 0),
        )
    if kept == 0:  # said of the rows looked at: a few between the samples may keep one (too few to train on)
        rows_seen = "no row keeps" if len(sample) == len(rows) else f"none of {len(sample)} rows sampled keeps"
        raise InputError(
            f"{path}: {rows_seen} a target token within MAX_LEN={max_len} (the assistant turns come later): "
            f"raise MAX_LEN"
        )
    return (
        f"data: {len(rows)} rows{repeated}; of {len(sample)} sampled, {cut} longer than MAX_LEN={max_len} "
        f"({targets - kept} of {targets} target tokens within {SUMMARY_SPAN} x MAX_LEN cut), {no_target} with no "
        f"target left; "
        f"{len(epoch_data) - used_per_epoch} {'packed ' if epoch_data is not dataset else ''}rows per epoch left out "
        f"by drop_last" + (packing_fill(dataset, epoch_data) if epoch_data is not dataset else "")
    )


def spread(rows: list, sample_size: int) -> list:
    """About `sample_size` of `rows` (all, if fewer), evenly spread over them: the same ones on every rank."""
    return rows[:: max(1, len(rows) // sample_size)]


def eval_rows_cut(eval_set: ChatDataset | None, path: str, sample_size: int = 1000) -> str:
    """A warning when rows of the evaluation data (`path`; up to `sample_size` spread over it) keep no target
    token within MAX_LEN: eval_loss is then of the other rows alone, which nothing else would say."""
    if eval_set is None:
        return ""
    sample = spread(eval_set.conversations, sample_size)
    none_kept = sum(row_targets_kept(eval_set, messages)[2] == 0 for messages in sample)
    if not none_kept:
        return ""
    rows = f"{len(sample)} rows" + (" sampled" if len(sample) < len(eval_set) else "")
    return (
        f"warning: {path}: {none_kept} of {rows} keep no target token within MAX_LEN={eval_set.max_len} (the "
        f"answers come later): {'eval_loss is of the other rows alone' if none_kept < len(sample) else 'no eval_loss'}"
        f"; raise MAX_LEN to evaluate them"
    )


def row_key(messages: list[dict]) -> tuple:
    """A row as it is trained on (roles, texts, weights), whatever its key order: one text part is its text, more
    stay parts (the chat template joins them its own way)."""
    content = [
        m["content"] if isinstance(m["content"], str) else tuple(p["text"] for p in m["content"]) for m in messages
    ]
    return tuple(
        (m["role"], text[0] if isinstance(text, tuple) and len(text) == 1 else text, m.get("weight", 1))
        for m, text in zip(messages, content, strict=True)
    )


def held_out_copies(train: list[list[dict]], held_out: list[list[dict]], path: str) -> str:
    """A warning when rows of the evaluation data (`path`) are exact copies of training rows: their loss is of
    answers trained on, which reads as a model better than it is (a split made after copies were in the data)."""
    if not held_out:
        return ""
    trained = set(map(row_key, train))
    n = sum(row_key(messages) in trained for messages in held_out)
    if not n:
        return ""
    return (
        f"warning: {path}: {n} of its {len(held_out)} rows are exact copies of DATA_PATH rows, not held out: "
        f"their loss is on answers trained on"
    )


def fields_left_out(tokenizer, conversations: list[list[dict]], path: str) -> str:
    """A warning naming the message fields the chat template does not render (OpenAI's "name" in Gemma's; a
    per-message "train": false flag), so the model never sees them: tried on a one-message conversation of the
    role and value the field first has in the data."""
    seen = {}  # field: (the first message that carries it, how many do)
    for messages in conversations:
        for m in messages:
            for field in m:
                if field in ("role", "content", "weight") or m[field] in (None, "", [], {}):  # nothing to see
                    continue
                first, n = seen.get(field, (m, 0))
                seen[field] = first, n + 1
    render = functools.partial(tokenizer.apply_chat_template, tokenize=False)

    def rendered(field: str, m: dict) -> bool:
        probe = {"role": m["role"], "content": "x"}
        try:
            return render([{**probe, field: m[field]}]) != render([probe])
        except Exception:  # the template reads the field and fails on this value: it is not left out
            return True

    left_out = [f"'{f}' (on {n} message{'s' * (n > 1)})" for f, (m, n) in seen.items() if not rendered(f, m)]
    if not left_out:
        return ""
    return (
        f"warning: {path}: the chat template leaves out {', '.join(left_out)}: the model never sees them (put what "
        f"matters in the content)"
    )


def inline_reasoning(conversations: list[list[dict]], path: str) -> str:
    """A warning counting the answers that carry <think>...</think> reasoning in their text (R1-style distills):
    it trains as visible answer text, after the empty thought block Gemma 4's generation prompt closes."""
    n = sum(m["role"] == "assistant" and "<think>" in text_of(m) for messages in conversations for m in messages)
    if not n:
        return ""
    return (
        f"warning: {path}: {n} answer{'s' * (n > 1)} hold <think> reasoning in their text: it trains as visible "
        f"answer text (Gemma 4 thinks in its own thought channel, not trained here); strip it to train on the answers"
    )


def row_targets_kept(dataset: ChatDataset, messages: list[dict]) -> tuple[bool, int, int]:
    """(whether the row is longer than max_len, its target tokens within SUMMARY_SPAN x max_len, those within
    max_len): a row of megabytes or a trace of a thousand turns is not made whole (on every rank) for a
    statistic."""
    labels = tokenize_conversation(dataset.tokenizer, messages, SUMMARY_SPAN * dataset.max_len, dataset.assistant_only)
    labels = labels["labels"]
    targets = sum(label != IGNORE_INDEX for label in labels[1:])  # position t predicts token t+1
    return len(labels) > dataset.max_len, targets, sum(label != IGNORE_INDEX for label in labels[1 : dataset.max_len])


def packing_fill(dataset: ChatDataset, packed) -> str:
    tokens = sum(dataset.token_lengths)
    return (
        f"; packed {len(dataset)} conversations into {len(packed)} rows of MAX_LEN={dataset.max_len}: fill "
        f"{tokens / (len(packed) * dataset.max_len):.1%}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description="Copy the rows of a chat JSON Lines file that train_ddp.py accepts to another file, and say "
        "why each other row was left out."
    )
    parser.add_argument("data", help="the JSON Lines file to check")
    parser.add_argument("out", help="where the rows that pass go")
    parser.add_argument(
        "--model",
        default=os.environ.get("MODEL_ID", str(Path(__file__).parent / "assets" / "tiny-gemma4")),
        help="MODEL_ID, whose tokenizer's control tokens the text must not spell (default: $MODEL_ID, else the "
        "shipped tiny Gemma 4)",
    )
    args = parser.parse_args()
    try:
        print(keep_passing_rows(args.data, args.out, control_tokens(chat_tokenizer(args.model))))
    except InputError as e:
        sys.exit(f"error: {e}")
