from __future__ import annotations

import asyncio
from pathlib import Path

from trainyard_runner.logstream import MAX_BATCH_LINES, WINDOW, LogStream, read_spool
from trainyard_runner.protocol import log_digest_add, log_digest_hex, log_digest_lines


def _texts(stream: LogStream, batch: tuple[int, list] | None) -> tuple[int, list[str]]:
    assert batch is not None
    first, lines = batch
    return first, [t for _, _, t in lines]


def test_lines_get_consecutive_seqs_in_arrival_order(tmp_path: Path) -> None:
    async def go() -> None:
        s = LogStream("j", tmp_path / "spool")
        await s.put("o", ["a", "b"])
        await s.put("e", ["c"])
        first, lines = s.take_batch()  # type: ignore[misc]
        assert first == 1
        assert lines == [(lines[0][0], "o", "a"), (lines[0][0], "o", "b"), (lines[2][0], "e", "c")]
        assert s.last_seq == 3

    asyncio.run(go())


def test_resends_exactly_the_unacked_lines_after_a_reconnect(tmp_path: Path) -> None:
    async def go() -> None:
        s = LogStream("j", tmp_path / "spool")
        await s.put("o", [str(i) for i in range(1, 11)])
        assert _texts(s, s.take_batch()) == (1, [str(i) for i in range(1, 11)])
        await s.put("o", ["11", "12"])
        s.ack(4)
        # The connection drops; the new server says it stored up to 6.
        s.rewind(6)
        s.close()
        assert _texts(s, s.take_batch()) == (7, ["7", "8", "9", "10", "11", "12"])
        assert s.take_batch() is None
        s.ack(12)
        assert s.drained()

    asyncio.run(go())


def test_rewind_below_dropped_lines_reads_them_back_from_the_spool(tmp_path: Path) -> None:
    async def go() -> None:
        s = LogStream("j", tmp_path / "spool")
        await s.put("o", ["1", "2", "3"])
        await s.put("e", ["4", "5"])
        s.take_batch()
        s.ack(5)
        s.rewind(2)  # the server lost lines it had acknowledged
        s.close()
        first, lines = s.take_batch()  # type: ignore[misc]
        assert (first, [(st, t) for _, st, t in lines]) == (3, [("o", "3"), ("e", "4"), ("e", "5")])

    asyncio.run(go())


def test_spool_keeps_every_line_and_skips_a_torn_record(tmp_path: Path) -> None:
    async def go() -> None:
        s = LogStream("j", tmp_path / "spool")
        await s.put("o", ["a", "b"])
        await s.put("e", ["ü", ""])
        s.take_batch()
        s.ack(4)
        s.close()

    asyncio.run(go())
    with (tmp_path / "spool").open("a") as f:
        f.write('[5, 1.0, "o", ["torn')
    got = [(seq, st, t) for seq, (_, st, t) in read_spool(tmp_path / "spool")]
    assert got == [(1, "o", "a"), (2, "o", "b"), (3, "e", "ü"), (4, "e", "")]
    assert [seq for seq, _ in read_spool(tmp_path / "spool", 3)] == [3, 4]


def test_batches_are_capped_and_the_window_is_bounded(tmp_path: Path) -> None:
    async def go() -> None:
        s = LogStream("j", tmp_path / "spool")
        total = MAX_BATCH_LINES * (WINDOW + 2)
        await s.put("o", ["x"] * total)
        batches = []
        while (b := s.take_batch()) is not None:
            batches.append(b)
        assert [(f, len(lines)) for f, lines in batches] == [
            (1 + i * MAX_BATCH_LINES, MAX_BATCH_LINES) for i in range(WINDOW)
        ]
        s.ack(MAX_BATCH_LINES)  # one batch acknowledged: one more may go
        nxt = s.take_batch()
        assert nxt is not None and nxt[0] == WINDOW * MAX_BATCH_LINES + 1
        assert s.take_batch() is None

    asyncio.run(go())


def test_a_full_buffer_blocks_the_producer_until_acked(tmp_path: Path) -> None:
    async def go() -> None:
        s = LogStream("j", tmp_path / "spool", max_lines=3)
        await s.put("o", ["1", "2", "3"])
        blocked = asyncio.create_task(s.put("o", ["4"], timeout=5))
        await asyncio.sleep(0.05)
        assert not blocked.done() and s.last_seq == 3
        s.take_batch()
        s.ack(2)
        await asyncio.wait_for(blocked, 1)
        assert s.last_seq == 4

    asyncio.run(go())


def test_a_partial_batch_waits_at_most_the_batch_delay(tmp_path: Path) -> None:
    async def go() -> None:
        s = LogStream("j", tmp_path / "spool")
        await s.put("o", ["1"])
        assert s.take_batch() is not None  # nothing in flight: sent at once
        await s.put("o", ["2"])
        assert s.take_batch() is None  # gathers company while a batch is in flight
        delay = s.seconds_until_due()
        assert delay is not None and 0 < delay <= 0.020
        await asyncio.sleep(delay + 0.002)
        assert _texts(s, s.take_batch()) == (2, ["2"])

    asyncio.run(go())


def test_an_attempt_after_the_first_numbers_from_its_seq_base_and_never_resends_below_it(tmp_path: Path) -> None:
    async def go() -> None:
        s = LogStream("j", tmp_path / "spool", first_seq=41)  # attempt 2: attempt 1 stored 1..40
        await s.put("o", ["a", "b", "c"])
        assert _texts(s, s.take_batch()) == (41, ["a", "b", "c"])
        s.ack(43)
        s.rewind(10)  # a server that lost lines: this attempt can resend only its own
        s.close()
        assert _texts(s, s.take_batch()) == (41, ["a", "b", "c"])

    asyncio.run(go())


def test_the_final_count_and_digest_cover_this_attempts_lines_also_after_a_resume(tmp_path: Path) -> None:
    """The digest the server continues over what it stores (protocol.log_digest_add)."""

    async def go() -> None:
        s = LogStream("j", tmp_path / "spool", first_seq=11)  # an attempt after 10 stored lines
        await s.put("o", ["a", "b"])
        await s.put("e", ["ü"])
        expected = log_digest_hex(log_digest_lines(0, [("o", "a"), ("o", "b"), ("e", "ü")]))
        assert s.shipped == (3, expected)
        s.close()
        again = LogStream("j", tmp_path / "spool", first_seq=11, resume=True)  # a new runner re-attaches
        assert again.shipped == (3, expected)

    asyncio.run(go())


def test_the_digest_continues_over_any_split_and_tells_order_streams_and_line_ends_apart() -> None:
    lines = [("o", "a\r"), ("e", ""), ("o", "ü \udcff"), ("o", "\t\x00"), ("e", "two\nparts")]
    whole = log_digest_lines(0, lines)
    for cut in range(len(lines) + 1):  # the runner's puts and the server's batches split differently
        assert log_digest_lines(log_digest_lines(0, lines[:cut]), lines[cut:]) == whole
    raw = "".join(text.replace("\n", "\u2424") + "\n" for _, text in lines).encode("utf-8", "surrogatepass")
    assert log_digest_add(0, "oeooe", raw) == whole  # the server's path: a chunk's streams and bytes
    assert log_digest_lines(0, [("o", "b"), ("o", "a")]) != log_digest_lines(0, [("o", "a"), ("o", "b")])
    assert log_digest_lines(0, [("e", "a")]) != log_digest_lines(0, [("o", "a")])
    assert log_digest_lines(0, [("o", "ab"), ("o", "")]) != log_digest_lines(0, [("o", "a"), ("o", "b")])
    assert log_digest_lines(0, lines[:-1]) != whole  # a lost line
    assert len(log_digest_hex(whole)) == 16 and log_digest_hex(0) == "0" * 16
