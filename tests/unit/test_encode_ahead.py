"""Prompts encoded on a thread of their own (engines/answers/encode_ahead.py): order, waits, errors, and on
the real engine the same answers as encoding inline."""

import threading

import pytest

from sparkbatch_dagster.engines import EngineRequest
from sparkbatch_dagster.engines.answers.encode_ahead import EncodeAhead, Prepared


def reqs(first: int, n: int) -> list[EngineRequest]:
    return [EngineRequest(str(i), [{"role": "user", "content": f"row {i}"}]) for i in range(first, first + n)]


def test_chunks_come_back_in_order_encoded_on_another_thread():
    threads: list[str] = []

    def encode(batch):
        threads.append(threading.current_thread().name)
        return [[int(r.id)] * 3 for r in batch]

    ahead = EncodeAhead(encode)
    for k in range(5):
        ahead.submit(reqs(10 * k, 10))
    assert ahead.rows == 50 and not ahead.room()
    got = [(req.id, ids) for req, ids in ahead.take(wait=True)]
    while ahead.rows:
        got += [(req.id, ids) for req, ids in ahead.take(wait=True)]
    assert [r for r, _ in got] == [str(i) for i in range(50)]
    assert all(ids == [int(r)] * 3 for r, ids in got)
    assert threads and all(name.startswith("sparkbatch-encode") for name in threads)
    ahead.close()


def test_take_waits_only_when_told_to():
    release = threading.Event()

    def encode(batch):
        release.wait()
        return [[1] for _ in batch]

    ahead = EncodeAhead(encode)
    ahead.submit(reqs(0, 2))
    assert list(ahead.take(wait=False)) == []  # not done: the engine's loop steps on
    assert ahead.rows == 2
    release.set()
    assert [r.id for r, _ in ahead.take(wait=True)] == ["0", "1"]
    assert ahead.rows == 0
    ahead.close()


@pytest.mark.parametrize("threaded", [True, False])
def test_an_encoding_error_is_raised_where_it_is_taken(threaded):
    def encode(batch):
        raise ValueError("template failed on row " + batch[0].id)

    ahead = EncodeAhead(encode, threaded=threaded)
    ahead.submit(reqs(7, 1))
    with pytest.raises(ValueError, match="row 7"):
        list(ahead.take(wait=True))
    ahead.close()


def test_without_the_thread_a_chunk_is_encoded_when_submitted():
    calls: list[str] = []
    ahead = EncodeAhead(lambda batch: calls.append(threading.current_thread().name) or [[0] for _ in batch],
                        threaded=False)
    assert ahead.depth == 1
    ahead.submit(reqs(0, 3))
    assert calls == [threading.current_thread().name] and not ahead.room()
    assert len(list(ahead.take(wait=False))) == 3


def test_close_drops_what_was_not_taken():
    release = threading.Event()
    ahead = EncodeAhead(lambda batch: release.wait() and [[0] for _ in batch])
    ahead.submit(reqs(0, 1))
    ahead.submit(reqs(1, 1))
    ahead.close()
    release.set()
    assert ahead.rows == 0 and list(ahead.take(wait=True)) == []


def test_prepared_hands_out_requests_in_order_reading_the_source_on_the_callers_thread():
    readers: list[str] = []
    encoders: list[str] = []

    def source():
        for req in reqs(0, 23):
            readers.append(threading.current_thread().name)
            yield req

    def encode(batch):
        encoders.append(threading.current_thread().name)
        return [f"body {r.id}" for r in batch]

    prepared = Prepared(source(), encode, chunk=5)
    got = []
    while (item := prepared.next()) is not None:
        got.append(item)
    prepared.close()
    assert [(r.id, body) for r, body in got] == [(str(i), f"body {i}") for i in range(23)]
    assert set(readers) == {threading.current_thread().name}
    assert len(encoders) == 5 and all(name.startswith("sparkbatch-encode") for name in encoders)


def test_prepared_rest_gives_back_every_request_not_handed_out_without_encoding_it():
    release = threading.Event()
    calls: list[int] = []

    def encode(batch):
        calls.append(len(batch))
        if len(calls) > 1:  # the chunks after the first stay unencoded until the test ends
            release.wait()
        return [None for _ in batch]

    prepared = Prepared(iter(reqs(0, 20)), encode, chunk=4)
    first = [prepared.next(), prepared.next()]
    assert [item[0].id for item in first if item] == ["0", "1"]
    # Handed out: 0 and 1. Waiting: 2-3 (encoded), 4-11 (queued on the thread), 12-19 (not read).
    assert [r.id for r in prepared.rest()] == [str(i) for i in range(2, 20)]
    release.set()
    prepared.close()


def test_token_bodies_tokenizes_a_chunk_as_token_body_does_each():
    from transformers import AutoTokenizer

    from sparkbatch_dagster.engines.platform.model import resolve_model
    from sparkbatch_dagster.engines.server.token_prompts import token_bodies, token_body

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(None))
    bodies = [{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": f"Say {w}."}]}
              for w in ["a", "longer sentence with more words", ""]]
    bodies[1]["chat_template_kwargs"] = {"enable_thinking": False}
    one_by_one = [token_body(tokenizer, b) for b in bodies]
    assert token_bodies(tokenizer, bodies) == one_by_one
    assert all("messages" not in b and "chat_template_kwargs" not in b and b["prompt"] for b in one_by_one)
    assert len({len(b["prompt"]) for b in one_by_one}) == 3
    assert token_bodies(tokenizer, []) == []
