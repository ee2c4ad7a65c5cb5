"""chat_data.py: validation that names the file, line and field; the chat template's targets."""

import pytest
from conftest import SAMPLE_DATA

import chat_data
from collate import IGNORE_INDEX
from guards import InputError


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "Hi there."}, {"role": "assistant", "content": "Hello!"}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "One?"},
            {"role": "assistant", "content": "Yes one."},
            {"role": "user", "content": "Two?"},
            {"role": "assistant", "content": "Two indeed."},
        ],
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b c"},
            {"role": "user", "content": "d"},
            {"role": "assistant", "content": "e f g"},
            {"role": "user", "content": "h"},
            {"role": "assistant", "content": "i"},
        ],
    ],
    ids=["single-turn", "system+multi-turn", "three-turns"],
)
def test_targets_are_exactly_the_assistant_turns(tokenizer, messages):
    ex = chat_data.tokenize_conversation(tokenizer, messages, max_len=4096, assistant_only=True)
    ids, labels = ex["input_ids"], ex["labels"]
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id  # <bos> once
    spans, current = [], []
    for i, lab in zip(ids, labels, strict=True):
        if lab == IGNORE_INDEX:
            if current:
                spans.append(current)
            current = []
        else:
            assert lab == i
            current.append(i)
    spans += [current] if current else []
    expected = [m["content"] + "<turn|>" for m in messages if m["role"] == "assistant"]
    assert [tokenizer.decode(s) for s in spans] == expected


def test_without_assistant_only_every_token_is_a_target(tokenizer):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    ex = chat_data.tokenize_conversation(tokenizer, messages, max_len=4096, assistant_only=False)
    assert ex["labels"] == ex["input_ids"]
    assert len(chat_data.tokenize_conversation(tokenizer, messages, max_len=5, assistant_only=True)["input_ids"]) == 5


@pytest.mark.parametrize(
    "row, error",
    [
        ('{"messages": [{"role": "bot", "content": "x"}]}', "2: message 0: unknown role 'bot'"),
        ('{"messages": [{"role": "user", "content": "x"}]}', "2: no assistant message, nothing to train on"),
        ("{not json", "2: not valid JSON"),
    ],
    ids=["role", "no-assistant", "json"],
)
def test_a_bad_row_is_named_by_file_line_and_field(tmp_path, row, error):
    path = tmp_path / "chat.jsonl"
    path.write_text(SAMPLE_DATA.read_text().splitlines()[0] + "\n" + row + "\n")
    with pytest.raises(InputError) as e:
        chat_data.load_conversations(str(path))
    assert str(e.value).startswith(f"{path}:{error}"), str(e.value)
