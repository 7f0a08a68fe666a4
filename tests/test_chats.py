import json

from app.chats import ChatStore


def test_history_survives_reopening_and_edits_keep_the_old_branch(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    chat = store.create_chat("Sky", settings={"temperature": 0.7, "system": "be brief"})
    question = store.add_message(chat, None, "user", "Why is the sky blue?")
    answer = store.add_message(chat, question, "assistant", "Rayleigh scattering.", reasoning="short light",
                               stats={"decode_tok_s": 12.5})
    edited = store.edit(question, "Why is the sunset red?")
    store.add_message(chat, edited, "assistant", "Longer path through air.")
    store.close()

    store = ChatStore(tmp_path / "chats.db")
    assert [m.content for m in store.branch(chat)] == ["Why is the sunset red?", "Longer path through air."]
    assert [m.id for m in store.siblings(question)] == [question, edited]
    store.select(question)  # back to the first version: its answer comes with it
    assert [m.id for m in store.branch(chat)] == [question, answer]
    assert store.message(answer).stats == {"decode_tok_s": 12.5}
    assert store.chat(chat).settings == {"temperature": 0.7, "system": "be brief"}


def test_regenerate_adds_a_sibling_answer(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    chat = store.create_chat()
    question = store.add_message(chat, None, "user", "hi")
    first = store.add_message(chat, question, "assistant", "hello")
    second = store.add_message(chat, question, "assistant", "hey there")
    assert [m.id for m in store.siblings(first)] == [first, second]
    assert store.branch(chat)[-1].id == second


def test_a_partial_answer_is_stored_as_incomplete(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    chat = store.create_chat()
    question = store.add_message(chat, None, "user", "count")
    answer = store.add_message(chat, question, "assistant", "", complete=False)
    store.update_message(answer, "one, two", complete=False, stats={"stop_reason": "crash"})
    reopened = ChatStore(tmp_path / "chats.db")
    saved = reopened.message(answer)
    assert (saved.content, saved.complete, saved.stats) == ("one, two", False, {"stop_reason": "crash"})


def test_rename_delete_and_listing_order(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    old, new = store.create_chat("old"), store.create_chat("new")
    store.add_message(old, None, "user", "bump")  # most recently updated first
    store.rename(new, "renamed")
    assert [c.title for c in store.chats()] == ["old", "renamed"]
    store.delete(old)
    assert [c.title for c in store.chats()] == ["renamed"]
    assert store.all_messages(old) == []


def test_exports(tmp_path):
    store = ChatStore(tmp_path / "chats.db")
    chat = store.create_chat("Export me")
    question = store.add_message(chat, None, "user", "2+2?")
    store.add_message(chat, question, "assistant", "4", reasoning="add")
    store.edit(question, "3+3?")
    markdown = store.export_markdown(chat)
    assert markdown.startswith("# Export me")
    assert "## User\n\n3+3?" in markdown and "2+2?" not in markdown  # the current branch only
    exported = json.loads(json.dumps(store.export_json(chat)))
    assert [m["content"] for m in exported["messages"]] == ["2+2?", "4", "3+3?"]  # every branch
    assert exported["current_leaf"] == exported["messages"][2]["id"]
    assert exported["messages"][1]["reasoning"] == "add"
